package upstream

// The emulation of duroxide-pg's own migration runner (src/migrations.rs),
// for migration files in upstream's format that no release of the addon
// carries: upstream's candidate fix (our port of it, candidate/) and the
// amendment this project offers upstream (upstream/ at the repository's
// root). It applies one file the way that runner applies each of its
// embedded files, so a schema ends as a duroxide-pg release carrying the
// file would leave it: its function texts (comments cut), its row in
// _duroxide_migrations.

import (
	"context"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// runnerLockKey is the key of the session advisory lock upstream's runner
// holds while it migrates schema: FNV-1a (64 bit) over
// "duroxide_pg:migrations:" and the schema's name, read as a signed
// integer. Concurrent runners of one schema serialise on it.
func runnerLockKey(schema string) int64 {
	const offset, prime = 0xcbf29ce484222325, 0x100000001b3
	h := uint64(offset)
	for _, b := range []byte("duroxide_pg:migrations:" + schema) {
		h ^= uint64(b)
		h *= prime
	}
	return int64(h)
}

// Preprocess is what upstream's runner does to a file's text before it
// runs it: the text is trimmed; a line holding "--" is cut there and
// trimmed when the text before the first "--" holds an even number of
// single quotes (so comments go, inside function bodies too), and kept
// whole otherwise; lines left empty are dropped.
func Preprocess(text string) string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if i := strings.Index(line, "--"); i >= 0 && strings.Count(line[:i], "'")%2 == 0 {
			line = strings.TrimSpace(line[:i])
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

// SplitStatements splits preprocessed text on ";" outside dollar-quoted
// regions, as upstream's runner does, with its quirk: outside a dollar
// quote, "$" followed by identifier characters and then anything but "$"
// keeps only the "$" (so a file's text must keep such words inside its
// DO block). Empty statements are dropped.
func SplitStatements(text string) []string {
	var out []string
	var cur strings.Builder
	tag := "" // the dollar quote we are inside, "" outside
	flush := func() {
		if s := strings.TrimSpace(cur.String()); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	for i := 0; i < len(text); {
		c := text[i]
		if c == '$' {
			j := i + 1
			for j < len(text) && isIdent(text[j]) {
				j++
			}
			switch {
			case j < len(text) && text[j] == '$':
				word := text[i : j+1]
				if tag == "" {
					tag = word
				} else if tag == word {
					tag = ""
				}
				cur.WriteString(word)
				i = j + 1
				continue
			case tag == "" && j > i+1:
				cur.WriteByte('$') // the quirk: the word after "$" is lost
				i = j
				continue
			}
		}
		if c == ';' && tag == "" {
			flush()
			i++
			continue
		}
		cur.WriteByte(c)
		i++
	}
	flush()
	return out
}

func isIdent(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// VersionOf is the version upstream's runner reads from a file name: the
// part before the first "_", as a number.
func VersionOf(file string) (int64, error) {
	prefix, _, _ := strings.Cut(path.Base(file), "_")
	v, err := strconv.ParseInt(prefix, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid migration version %s: %w", prefix, err)
	}
	return v, nil
}

// ApplyMigration applies one migration file (its name, as upstream's runner
// records it, and its text) to schema over conn, as that runner applies an
// unrecorded file: under its session lock of the schema, in one
// transaction with search_path set to the schema and pg_temp (0.1.35),
// each statement of the preprocessed text in turn, then the file's row in
// _duroxide_migrations. The schema and its _duroxide_migrations table must
// exist; a file whose version is already recorded is refused.
func ApplyMigration(ctx context.Context, conn *pgx.Conn, schema, file, text string) error {
	version, err := VersionOf(file)
	if err != nil {
		return err
	}
	name := path.Base(file)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", runnerLockKey(schema)); err != nil {
		return fmt.Errorf("migration %d: take the runner's lock of schema %s: %w", version, schema, err)
	}
	defer func() {
		// Best effort, as upstream's.
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", runnerLockKey(schema))
	}()
	table := pgx.Identifier{schema, "_duroxide_migrations"}.Sanitize()
	var recorded bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+table+" WHERE version = $1)", version).Scan(&recorded); err != nil {
		return fmt.Errorf("migration %d: read %s: %w", version, table, err)
	}
	if recorded {
		return fmt.Errorf("migration %d (%s): schema %s already records version %d; upstream's runner would skip it", version, name, schema, version)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+pgx.Identifier{schema}.Sanitize()+", pg_temp"); err != nil {
		return fmt.Errorf("migration %d: %w", version, err)
	}
	for i, stmt := range SplitStatements(Preprocess(text)) {
		if _, err := tx.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("failed to execute statement %d in migration %d: %w", i+1, version, err)
		}
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (version, name) VALUES ($1, $2)", version, name); err != nil {
		return fmt.Errorf("migration %d: record it: %w", version, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migration %d: commit: %w", version, err)
	}
	return nil
}
