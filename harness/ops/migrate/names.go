package migrate

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameBytes is the longest name PostgreSQL keeps (NAMEDATALEN - 1):
// it cuts a longer one to its first 63 bytes without a word, so a schema
// named with 70 characters would be another schema than the one asked for.
const MaxNameBytes = 63

// ErrBadName is what CheckName's refusals wrap.
var ErrBadName = errors.New("not a usable name")

// CheckName refuses a schema, table or role name the operator library
// cannot act on as given; what says which (e.g. "--schema"). Any other
// name, quotes, semicolons, capitals and non-ASCII letters included, is
// used exactly as given (always quoted). A name is refused when it is
// empty, longer than MaxNameBytes bytes, not valid UTF-8 or holds a NUL
// or another control character; a schema's or table's when it holds a
// dot (dotted is how goose and psql read schema.table, and the pack's
// advisory keys join the schema's name and the instance id with a dot:
// schema "a.b" with instance "x" would share keys with schema "a" and
// instance "b.x").
func CheckName(what, name string, dotted bool) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: %s is empty", ErrBadName, what)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrBadName, what, name)
	case len(name) > MaxNameBytes:
		return fmt.Errorf("%w: %s %q is %d bytes long; PostgreSQL keeps %d bytes of a name and would silently use %q instead: give a shorter one",
			ErrBadName, what, name, len(name), MaxNameBytes, truncateName(name))
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%w: %s %q holds a control character", ErrBadName, what, name)
	case !dotted && strings.Contains(name, "."):
		return fmt.Errorf("%w: %s %q holds a dot, which goose and psql read as schema.table and which the pack's advisory keys use to join the schema's name and the instance id", ErrBadName, what, name)
	}
	return nil
}

// truncateName is name as PostgreSQL would keep it: its first
// MaxNameBytes bytes, cut at a character boundary.
func truncateName(name string) string {
	n := MaxNameBytes
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// checkNames is CheckName on the options' schema, version table and role
// (when set), after Names.
func (o Options) checkNames() error {
	if err := CheckName("schema", o.Schema, false); err != nil {
		return err
	}
	if err := CheckName("version table", o.VersionTable, false); err != nil {
		return err
	}
	if o.Role != "" {
		return CheckName("role", o.Role, true)
	}
	return nil
}
