package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	migrations "github.com/duroxide-pg/migrations"

	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
)

func runMigrate(ctx context.Context, env *Env, args []string) error {
	fs := NewFlags(env, "migrate")
	var t target
	t.register(fs)
	to := fs.String("to", "", "target version: up applies up to it, down rolls back to it")
	verbose := fs.Bool("v", false, "log each migration")
	lockTimeout := fs.Duration("lock-timeout", migrate.DefaultLockTimeout,
		"longest wait of a migration for a lock before it is rolled back and retried (0: wait as long as the server's lock_timeout says); writers of a table queue behind a migration waiting for it")
	lockRetries := fs.Int("lock-retries", migrate.DefaultLockRetries, "how many times a migration rolled back on --lock-timeout runs again")
	pos, err := Parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return Usagef("migrate needs one action: up, down, status, version or plan (e.g. `harness migrate up --dsn ...`)")
	}
	action := pos[0]
	switch action {
	case "up", "down", "status", "version", "plan":
	default:
		return Usagef("unknown migrate action %q: use up, down, status, version or plan", action)
	}
	var version int64 = -1
	if *to != "" {
		if action != "up" && action != "down" && action != "plan" {
			return Usagef("--to only applies to up, down and plan")
		}
		v, err := strconv.ParseInt(*to, 10, 64)
		if err != nil || v < 0 {
			return Usagef("--to %q is not a version number: give a version of the pack (0 for down: everything)", *to)
		}
		version = v
	}
	if *lockTimeout < 0 {
		return Usagef("--lock-timeout %v is negative: give a duration (5s), or 0 for no bound", *lockTimeout)
	}
	if *lockTimeout > 0 && *lockTimeout < time.Millisecond {
		return Usagef("--lock-timeout %v is below a millisecond, lock_timeout's unit", *lockTimeout)
	}
	if *lockRetries < 0 {
		return Usagef("--lock-retries %d is negative: give 0 for none", *lockRetries)
	}
	if err := t.resolve(env); err != nil {
		return err
	}
	if err := t.checkTo(version, action == "down" || action == "plan"); err != nil {
		return err
	}
	if err := t.checkMigrationsDir("migrate"); err != nil {
		return err
	}
	// status, version and the check before down only read: goose's own
	// provider would create the schema and its table to answer them.
	switch action {
	case "status", "version", "down", "plan":
		st, err := t.inspect(ctx)
		if err != nil {
			return err
		}
		switch {
		case action == "version":
			fmt.Fprintln(env.Stdout, st.Version())
			if !st.TableExists {
				fmt.Fprintf(env.Stderr, "harness: %s\n", missingWhat(st))
			}
			return nil
		case action == "status":
			return printStatus(ctx, env, t, st)
		case action == "plan":
			return printPlan(env, st, version)
		case !st.SchemaExists || !st.TableExists:
			return Usagef("%s: nothing to roll back; nothing was created", missingWhat(st))
		}
	}
	run := migrate.Options{Verbose: *verbose, LockTimeout: *lockTimeout, LockRetries: *lockRetries, Log: env.Stderr}
	// The flags say 0 for none; the options say negative for none.
	if *lockTimeout == 0 {
		run.LockTimeout = -1
	}
	if *lockRetries == 0 {
		run.LockRetries = -1
	}
	r, err := t.open(ctx, run)
	if err != nil {
		return err
	}
	defer r.Close()
	if version > r.Latest() || (version == 0 && action == "up") {
		return Usagef("version %d does not exist: the pack has 1..%d", version, r.Latest())
	}
	switch action {
	case "up":
		var err error
		if version >= 0 {
			_, err = r.UpTo(ctx, version)
		} else {
			_, err = r.Up(ctx)
		}
		if errors.Is(err, migrate.ErrNoSuchVersion) {
			return Usagef("%v", err)
		}
		if err != nil {
			return err
		}
		printRestored(env, r.Restored())
		return printVersion(ctx, env, r, "now at version")
	case "down":
		var err error
		if version >= 0 {
			_, err = r.DownTo(ctx, version)
		} else {
			_, err = r.Down(ctx)
		}
		if errors.Is(err, migrate.ErrNoSuchVersion) {
			return Usagef("%v", err)
		}
		if err != nil {
			return err
		}
		return printVersion(ctx, env, r, "now at version")
	}
	return nil
}

// printRestored says what the restore step did: each fix it put back,
// each function it left as upstream changed it.
func printRestored(env *Env, plan []restore.Function) {
	for _, f := range plan {
		switch f.Action {
		case restore.Restore:
			fmt.Fprintf(env.Stdout, "restored the fix of %s: it was %s (duroxide-pg's runner replaced the fix); installed the fix of %s\n", f.Name, f.Definition, f.Fix)
		case restore.Left:
			fmt.Fprintf(env.Stdout, "left %s as it is: it is %s, which upstream changed in a way this pack has no fix for yet\n", f.Name, f.Definition)
		}
	}
}

// missingWhat says what a schema lacks for goose ("" when nothing).
func missingWhat(st *migrate.State) string {
	switch {
	case !st.SchemaExists:
		return fmt.Sprintf("schema %s does not exist", st.Schema)
	case !st.TableExists:
		return fmt.Sprintf("schema %s has no goose version table", st.Schema)
	}
	return ""
}

// printStatus lists every migration of the pack with its state, as goose's
// status does, from what ReadState read; then says on stderr where the
// schema stands (where a failed run stopped): the newest applied version,
// the next file `migrate up` runs, and what the schema holds of a
// migration that runs outside a transaction and stopped part-way.
func printStatus(ctx context.Context, env *Env, t target, st *migrate.State) error {
	sources, err := migrate.Sources(nil)
	if err != nil {
		return err
	}
	if !st.TableExists {
		fmt.Fprintf(env.Stderr, "harness: %s: every migration is pending\n", missingWhat(st))
	}
	tw := tabwriter.NewWriter(env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "VERSION\tSTATE\tAPPLIED AT\tFILE\n")
	for _, s := range sources {
		state, at := "pending", "-"
		if when, ok := st.AppliedAt(s.Version); ok {
			state, at = "applied", when.UTC().Format("2006-01-02 15:04:05Z")
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Version, state, at, s.Path)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write the status: %w", err)
	}
	if !st.TableExists {
		return nil
	}
	objects, err := t.schemaObjects(ctx)
	if err != nil {
		return err
	}
	for _, line := range whereItStands(st, objects) {
		fmt.Fprintf(env.Stderr, "harness: %s\n", line)
	}
	return nil
}

// whereItStands says where schema st stands in the pack: its newest
// applied version, the next migration `migrate up` runs (where a failed
// up stopped), versions left pending below the newest applied, and, for a
// migration that runs outside a transaction, the part of it the schema
// holds when goose's table disagrees (an up or a down that stopped
// part-way). objects are the schema's objects ("table x", "index x",
// "function x", "trigger x").
func whereItStands(st *migrate.State, objects map[string]bool) []string {
	pack := migrations.MustPack()
	v := st.Version()
	var lines []string
	var next *migrations.Migration
	var below []string
	for i := range pack {
		m := pack[i]
		if _, applied := st.AppliedAt(m.Version); applied {
			continue
		}
		if m.Version < v {
			below = append(below, strconv.FormatInt(m.Version, 10))
			continue
		}
		if next == nil {
			next = &pack[i]
		}
	}
	at := fmt.Sprintf("schema %s is at goose version %d", st.Schema, v)
	if m, ok := migrations.ByVersion(v); ok {
		at += " (" + m.File + "), the newest applied"
	}
	if next == nil {
		lines = append(lines, at+"; nothing pending: it is the pack's latest")
	} else {
		lines = append(lines, fmt.Sprintf("%s; next pending: %s, where `migrate up` starts (a failed `migrate up` stopped there; a failed `migrate down` stopped at the newest applied)", at, next.File))
	}
	if len(below) > 0 {
		lines = append(lines, fmt.Sprintf("pending below version %d: %s; `migrate up` refuses to run while they are (goose applies the pack in order)", v, strings.Join(below, ", ")))
	}
	if next != nil && next.NoTransaction {
		if held := heldOf(*next, objects, true); len(held) > 0 {
			lines = append(lines, fmt.Sprintf("%s is pending, yet the schema holds %s, which it adds: an up stopped part-way through it (it runs outside a transaction, its finished steps stay); the next `migrate up` finishes it",
				next.File, strings.Join(held, ", ")))
		}
	}
	if m, ok := migrations.ByVersion(v); ok && m.NoTransaction {
		if missing := heldOf(m, objects, false); len(missing) > 0 {
			lines = append(lines, fmt.Sprintf("%s is applied, yet the schema lacks %s, which it adds: a down stopped part-way through it (its Down runs outside a transaction); the next `migrate down` finishes it",
				m.File, strings.Join(missing, ", ")))
		}
	}
	return lines
}

// heldOf lists the objects m's Adds line names that the schema holds
// (held true) or lacks (held false).
func heldOf(m migrations.Migration, objects map[string]bool, held bool) []string {
	var out []string
	for _, a := range m.Adds {
		if objects[a] == held {
			out = append(out, a)
		}
	}
	return out
}

// schemaObjects reads the names of the target schema's tables, indexes,
// functions and triggers, as a fix's Adds line names them ("table x"). It
// only reads.
func (t *target) schemaObjects(ctx context.Context) (map[string]bool, error) {
	db, err := t.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `
		SELECT CASE c.relkind WHEN 'i' THEN 'index ' ELSE 'table ' END || c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'i')
		UNION ALL
		SELECT 'function ' || p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1
		UNION ALL
		SELECT 'trigger ' || g.tgname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
		JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND NOT g.tgisinternal`, t.schema)
	if err != nil {
		return nil, fmt.Errorf("read the objects of schema %s: %w", t.schema, err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("read the objects of schema %s: %w", t.schema, err)
		}
		out[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the objects of schema %s: %w", t.schema, err)
	}
	return out, nil
}

func printVersion(ctx context.Context, env *Env, r *migrate.Runner, prefix string) error {
	v, err := r.Version(ctx)
	if err != nil {
		return err
	}
	if prefix == "" {
		fmt.Fprintln(env.Stdout, v)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%s %d (schema %s)\n", prefix, v, r.Schema())
	return nil
}

// printPlan lists what `migrate up --to version` (no version: the pack's
// latest) would apply to the schema as st found it, each migration with
// its header's locks and duration and the size of the tables those locks
// name; for a version below the schema's, what `migrate down --to
// version` would roll back, each Down, newest first, with its header's
// Down locks and Down duration. It only reads.
func printPlan(env *Env, st *migrate.State, to int64) error {
	pack, err := migrations.Pack()
	if err != nil {
		return err
	}
	if to >= 0 && to < st.Version() {
		return printDownPlan(env, st, to, pack)
	}
	if to < 0 {
		to = pack[len(pack)-1].Version
	}
	var pending []migrations.Migration
	for _, m := range pack {
		if _, applied := st.AppliedAt(m.Version); !applied && m.Version <= to {
			pending = append(pending, m)
		}
	}
	if !st.TableExists {
		fmt.Fprintf(env.Stderr, "harness: %s: every migration is pending\n", missingWhat(st))
	}
	if len(pending) == 0 {
		fmt.Fprintf(env.Stdout, "schema %s is at goose version %d: nothing to apply up to %d\n", st.Schema, st.Version(), to)
		return nil
	}
	fmt.Fprintf(env.Stdout, "schema %s is at goose version %d; `migrate up` to %d applies %d migration(s), each in its own transaction:\n",
		st.Schema, st.Version(), to, len(pending))
	for _, m := range pending {
		printPlanStep(env, st, m.File, m.NoTransaction, m.Locks, m.Duration)
	}
	return nil
}

// printDownPlan lists the Downs `migrate down --to to` runs on the schema
// as st found it: every applied version above to, newest first (goose's
// order), each with its Down's locks and duration.
func printDownPlan(env *Env, st *migrate.State, to int64, pack []migrations.Migration) error {
	var path []migrations.Migration
	for i := len(pack) - 1; i >= 0; i-- {
		if _, applied := st.AppliedAt(pack[i].Version); applied && pack[i].Version > to {
			path = append(path, pack[i])
		}
	}
	fmt.Fprintf(env.Stdout, "schema %s is at goose version %d; `migrate down --to %d` rolls back %d migration(s), newest first, each in its own transaction (a failure stops there and keeps the ones rolled back before it):\n",
		st.Schema, st.Version(), to, len(path))
	for _, m := range path {
		printPlanStep(env, st, m.File+" (down)", m.NoTransaction, m.DownLocks, m.DownDuration)
	}
	return nil
}

// printPlanStep prints one migration of a plan: its name, its locks and
// its duration as its header says them, and the live size of every table
// those locks name.
func printPlanStep(env *Env, st *migrate.State, name string, noTransaction bool, locks, duration string) {
	fmt.Fprintf(env.Stdout, "\n%s\n", name)
	if noTransaction {
		fmt.Fprint(env.Stdout, indentWrap("runs:     ", "outside a transaction (NO TRANSACTION): each statement commits on its own; interrupted, the steps it finished stay and the next run finishes it"))
	}
	fmt.Fprint(env.Stdout, indentWrap("locks:    ", cmp.Or(locks, "(the file does not say)")))
	fmt.Fprint(env.Stdout, indentWrap("duration: ", cmp.Or(duration, "(the file does not say)")))
	var sizes []string
	for _, name := range slices.Sorted(maps.Keys(st.Tables)) {
		if lockedTableRE(name).MatchString(locks) {
			sizes = append(sizes, fmt.Sprintf("%s %s, %s", name, rowsText(st.Tables[name].Rows), bytesText(st.Tables[name].Bytes)))
		}
	}
	if len(sizes) > 0 {
		fmt.Fprint(env.Stdout, indentWrap("tables:   ", strings.Join(sizes, "; ")))
	}
}

// lockedTableRE matches "on <table>" in a Locks paragraph, the table's name
// as a whole word.
func lockedTableRE(table string) *regexp.Regexp {
	return regexp.MustCompile(`\bon ` + regexp.QuoteMeta(table) + `\b`)
}

func rowsText(n int64) string {
	if n < 0 {
		return "rows unknown (never analyzed)"
	}
	return fmt.Sprintf("~%d rows", n)
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d kB", n>>10)
	}
}

// indentWrap wraps text at 78 columns after label, the lines after the
// first indented by the label's width.
func indentWrap(label, text string) string {
	var b strings.Builder
	line := "  " + label
	pad := strings.Repeat(" ", len(line))
	for i, w := range strings.Fields(text) {
		if i > 0 && len(line)+1+len(w) > 78 {
			b.WriteString(line + "\n")
			line = pad + w
			continue
		}
		if i > 0 {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}
