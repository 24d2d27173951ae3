// Package doctor checks one duroxide schema the way an on-call engineer
// needs it: which migrations are applied (goose's and duroxide-pg's
// bookkeeping), which definition each function a pack fix migration fixes
// has (the pack's fix, upstream's at version V, or unknown), messages trapped by the lease bug, stale instance locks, and the clock
// skew between this host and the database. Every finding has a severity and
// says what to do.
package doctor

import (
	"context"
	"database/sql"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	migrations "github.com/duroxide-pg/migrations"
	"github.com/duroxide-pg/migrations/harness/ops/fingerprint"
	"github.com/duroxide-pg/migrations/harness/ops/migrate"
	"github.com/duroxide-pg/migrations/harness/ops/restore"
)

// Severities, in increasing order; a report's status is its worst finding.
const (
	OK       = "ok"
	Warning  = "warning"
	Critical = "critical"
)

func rank(s string) int {
	switch s {
	case Warning:
		return 1
	case Critical:
		return 2
	}
	return 0
}

// skewWarning is the clock skew from which the check warns. It is
// critical from the pack's lease bound on (migrations.LeaseBound, read from
// sql/): past it the database clock no longer lengthens a lease.
const skewWarning = time.Second

// Options tune Check.
type Options struct {
	// Schema holds the duroxide objects (migrate.DefaultSchema when empty).
	Schema string
	// VersionTable is goose's table (migrate.VersionTable when empty).
	VersionTable string
	// MaxAttempts: queue messages fetched more often than this are
	// reported as trapped (default 10).
	MaxAttempts int
	// Now is this host's clock (time.Now when nil), for the skew check.
	Now func() time.Time
	// ListLimit caps the instances listed per finding (0: DefaultListLimit;
	// negative: every one).
	ListLimit int
}

// DefaultListLimit is how many instances a finding lists when
// Options.ListLimit is 0.
const DefaultListLimit = 20

// Report is the result of Check; its JSON form is for monitoring.
type Report struct {
	Schema string `json:"schema"`
	Status string `json:"status"`
	// GooseVersion is goose's newest applied version, nil without a goose
	// table.
	GooseVersion *int64 `json:"goose_version"`
	// UpstreamVersion is max(version) of _duroxide_migrations, nil without
	// that table.
	UpstreamVersion *int64 `json:"duroxide_migrations_version"`
	// PackLatest is the newest version of the pack this doctor knows.
	PackLatest int64 `json:"pack_latest_version"`
	// Functions identifies every function a fix migration of the pack
	// fixes, in the order of those migrations.
	Functions     []FunctionCheck `json:"fixed_functions"`
	Trapped       []Trapped       `json:"trapped_messages"`
	ExpiredLeases []Lease         `json:"expired_leases"`
	OrphanLocks   []Lease         `json:"locks_without_messages"`
	ClockSkewMs   int64           `json:"clock_skew_ms"`
	MaxAttempts   int             `json:"max_attempts"`
	// MaxAttemptCount is the highest attempt_count of any orchestrator
	// message; TrappedMessages counts the messages above MaxAttempts (over
	// every instance, not only the ones listed in Trapped).
	MaxAttemptCount int64 `json:"max_attempt_count"`
	TrappedMessages int64 `json:"trapped_message_count"`
	// TrappedInstances counts the instances with trapped messages: Trapped
	// lists the first Options.ListLimit of them, the worst first.
	TrappedInstances int `json:"trapped_instance_count"`
	// WorkerTrappedItems counts the worker_queue items fetched more than
	// MaxAttempts times (activities the runtime will poison), of
	// WorkerTrappedInstances instances; WorkerMaxAttemptCount is the
	// highest attempt_count of any worker item.
	WorkerTrappedItems     int64 `json:"worker_trapped_item_count"`
	WorkerTrappedInstances int64 `json:"worker_trapped_instance_count"`
	WorkerMaxAttemptCount  int64 `json:"worker_max_attempt_count"`
	// Heads is the queue heads' check, nil where the schema has none.
	Heads    *Heads    `json:"queue_heads,omitempty"`
	Findings []Finding `json:"findings"`
}

// Verdicts of a FunctionCheck.
const (
	// Fixed: the newest fix of the pack that goose records as applied is
	// in force.
	Fixed = "fixed"
	// Replaced: goose records the fix as applied, yet the function holds
	// another definition the pack knows: duroxide-pg's runner (or someone)
	// replaced it since. `harness migrate up` puts it back.
	Replaced = "replaced"
	// Unfixed: a definition the pack knows, and no fix of it applied yet
	// (goose has not reached the fix that serves its behaviour).
	Unfixed = "unfixed"
	// Left: a definition the pack knows whose behaviour no fix of the
	// pack serves yet (upstream changed the function in a way this pack
	// has no fix for): left as it is.
	Left = "left"
	// Unknown: neither upstream's nor the pack's (a hand edit, a newer
	// upstream).
	Unknown = "unknown"
	// Missing: no such function, or more than one overload.
	Missing = "missing"
)

// FunctionCheck identifies the installed definition of one function that
// the pack fixes.
type FunctionCheck struct {
	Name string `json:"name"`
	// FixedBy is the fix migration whose body is in force, would be put
	// back (Replaced) or installed by `harness migrate up` (Unfixed); empty
	// when none serves the definition.
	FixedBy string `json:"fixed_by"`
	// Verdict is Fixed, Replaced, Unfixed, Left, Unknown or Missing.
	Verdict string `json:"verdict"`
	// Definition says which one it is: "pack 0021 fix, upstream 20
	// behaviour", "upstream 20-23", "upstream candidate 0024, port".
	Definition string `json:"definition,omitempty"`
	// Note says what an unreleased upstream definition (upstream's
	// candidate fix, say) has and lacks.
	Note string `json:"note,omitempty"`
	// Fingerprint is the md5 of its source with the schema's name replaced
	// by @schema@ (as harness/ops/fingerprint computes it).
	Fingerprint string `json:"fingerprint,omitempty"`
	Definitions int    `json:"definitions"`
}

// Trapped is one instance whose orchestrator messages were fetched more than
// MaxAttempts times.
type Trapped struct {
	InstanceID      string    `json:"instance_id"`
	Messages        int64     `json:"messages"`
	MaxAttemptCount int64     `json:"max_attempt_count"`
	OldestVisibleAt time.Time `json:"oldest_visible_at"`
}

// Lease is one instance_locks row.
type Lease struct {
	InstanceID  string `json:"instance_id"`
	LockedUntil int64  `json:"locked_until_ms"`
	// ExpiredForMs is how long ago the lease ran out, by the database clock
	// (negative: still valid).
	ExpiredForMs int64 `json:"expired_for_ms"`
}

// Finding is one problem (or the all-clear of one check) with what to do.
type Finding struct {
	Severity string `json:"severity"`
	Check    string `json:"check"`
	Message  string `json:"message"`
	Action   string `json:"action,omitempty"`
}

// Querier is what Check reads through.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Check inspects opts.Schema through q. It changes nothing.
func Check(ctx context.Context, q Querier, opts Options) (*Report, error) {
	opts.Schema, opts.VersionTable = migrate.Names(opts.Schema, opts.VersionTable)
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	switch {
	case opts.ListLimit == 0:
		opts.ListLimit = DefaultListLimit
	case opts.ListLimit < 0:
		opts.ListLimit = math.MaxInt
	}
	r := &Report{Schema: opts.Schema, MaxAttempts: opts.MaxAttempts, PackLatest: migrations.Latest(),
		Trapped: []Trapped{}, ExpiredLeases: []Lease{}, OrphanLocks: []Lease{}}
	add := func(sev, check, msg, action string) {
		r.Findings = append(r.Findings, Finding{sev, check, msg, action})
	}
	s := opts.Schema
	qual := func(name string) string { return pgx.Identifier{s, name}.Sanitize() }

	// Bookkeeping.
	exists := func(name string) (bool, error) {
		var ok bool
		err := q.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", qual(name)).Scan(&ok)
		return ok, err
	}
	hasGoose, err := exists(opts.VersionTable)
	if err != nil {
		return nil, fmt.Errorf("look for goose's table: %w", err)
	}
	if hasGoose {
		var v sql.NullInt64
		if err := q.QueryRowContext(ctx, "SELECT max(version_id) FROM "+qual(opts.VersionTable)+" WHERE is_applied").Scan(&v); err != nil {
			return nil, fmt.Errorf("read goose's version: %w", err)
		}
		r.GooseVersion = &v.Int64
	}
	hasUpstream, err := exists("_duroxide_migrations")
	if err != nil {
		return nil, err
	}
	if hasUpstream {
		var v sql.NullInt64
		if err := q.QueryRowContext(ctx, "SELECT max(version) FROM "+qual("_duroxide_migrations")).Scan(&v); err != nil {
			return nil, fmt.Errorf("read _duroxide_migrations: %w", err)
		}
		r.UpstreamVersion = &v.Int64
	}
	hasQueue, err := exists("orchestrator_queue")
	if err != nil {
		return nil, err
	}
	if !hasUpstream && !hasGoose && !hasQueue {
		add(Critical, "schema", fmt.Sprintf("schema %s has no duroxide tables", s),
			"check --schema; for a new database run `harness migrate up`")
		return r.finish(), nil
	}
	switch {
	case !hasGoose:
		add(Warning, "migrations", "no goose version table: this database was migrated by duroxide-pg's own runner",
			fmt.Sprintf("run `harness baseline --schema %s` (try --dry-run first), then `harness migrate up`", s))
	case *r.GooseVersion < r.PackLatest:
		add(Warning, "migrations", fmt.Sprintf("goose is at version %d; the pack has %d", *r.GooseVersion, r.PackLatest),
			fmt.Sprintf("run `harness migrate up --schema %s`", s))
	default:
		add(OK, "migrations", fmt.Sprintf("goose at version %d", *r.GooseVersion), "")
	}

	// The functions the pack fixes.
	var applied int64
	if r.GooseVersion != nil {
		applied = *r.GooseVersion
	}
	if r.Functions, err = functions(ctx, q, s, applied); err != nil {
		return nil, err
	}
	for _, f := range r.Functions {
		judge(f, s, r, add)
	}

	// Queue and locks.
	if hasQueue {
		if err := checkQueue(ctx, q, s, opts, r, add); err != nil {
			return nil, err
		}
		if err := checkHeads(ctx, q, s, r, add); err != nil {
			return nil, err
		}
	}

	// Clock skew: the database's clock against ours, at the midpoint of
	// the round trip.
	var dbMs int64
	t0 := opts.Now()
	if err := q.QueryRowContext(ctx, "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint").Scan(&dbMs); err != nil {
		return nil, fmt.Errorf("read the database clock: %w", err)
	}
	t1 := opts.Now()
	mid := t0.Add(t1.Sub(t0) / 2)
	r.ClockSkewMs = dbMs - mid.UnixMilli()
	skew := time.Duration(abs(r.ClockSkewMs)) * time.Millisecond
	dir := "ahead of"
	if r.ClockSkewMs < 0 {
		dir = "behind"
	}
	msg := fmt.Sprintf("database clock is %s %s this host (round trip %s)", skew, dir, t1.Sub(t0).Round(time.Millisecond))
	fix := "sync both clocks (NTP/chrony); duroxide-pg leases are computed from the application host's clock"
	switch {
	case skew >= skewCritical():
		add(Critical, "clock", msg+": "+beyondLeaseBound(r.ClockSkewMs), fix)
	case skew >= skewWarning:
		add(Warning, "clock", msg, fix)
	default:
		add(OK, "clock", msg, "")
	}
	return r.finish(), nil
}

// skewCritical is the clock skew from which the check is critical: the
// pack's lease bound, read from sql/ (migrations.LeaseBound).
func skewCritical() time.Duration { return migrations.LeaseBound() }

// beyondLeaseBound says what a skew of skewMs (the database's clock minus
// this host's) at or past the pack's lease bound means for the leases.
func beyondLeaseBound(skewMs int64) string {
	bound := skewCritical()
	if skewMs > 0 {
		return fmt.Sprintf("at or beyond the pack's lease bound (%s), the most the database clock lengthens a lease: "+
			"a caller on a clock like this host's gets its leases from its own clock plus %s, short by the database's, "+
			"and expired at return once its clock is behind by more than %s plus the lock timeout "+
			"(expired_leases lists the leases held past their end)", bound, bound, bound)
	}
	return fmt.Sprintf("at or beyond the pack's lease bound (%s): the leases follow the callers' clocks, so by the database's "+
		"each one ends that much later than its holder's clock says (expired_leases, which reads the database clock, "+
		"misses a lease held less than that past its end)", bound)
}

func (r *Report) finish() *Report {
	r.Status = OK
	for _, f := range r.Findings {
		if rank(f.Severity) > rank(r.Status) {
			r.Status = f.Severity
		}
	}
	return r
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// Functions is the check of the functions the pack fixes (see functions)
// in schema, against the version goose's table (migrate.VersionTable)
// records.
func Functions(ctx context.Context, q Querier, schema string) ([]FunctionCheck, error) {
	var v sql.NullInt64
	table := pgx.Identifier{schema, migrate.VersionTable}.Sanitize()
	err := q.QueryRowContext(ctx, "SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL ELSE 0 END", table).Scan(&v)
	if err != nil {
		return nil, fmt.Errorf("look for goose's table: %w", err)
	}
	if v.Valid {
		if err := q.QueryRowContext(ctx, "SELECT max(version_id) FROM "+table+" WHERE is_applied").Scan(&v); err != nil {
			return nil, fmt.Errorf("read goose's version: %w", err)
		}
	}
	return functions(ctx, q, schema, v.Int64)
}

// functions identifies, in schema, the definition of every function a fix
// migration of the pack fixes, once each, against the fixes goose records
// as applied (gooseVersion, 0 for none): the restore's plan at that
// version (package restore) says whether the newest applied fix is in
// force, was replaced, or serves the definition at all; the plan at the
// pack's latest names the fix `harness migrate up` would install. A
// function that only an unreleased upstream migration adds, or that a fix
// not applied yet adds, is not listed when absent.
func functions(ctx context.Context, q Querier, schema string, gooseVersion int64) ([]FunctionCheck, error) {
	now, err := restore.Plan(ctx, q, schema, gooseVersion)
	if err != nil {
		return nil, err
	}
	latest, err := restore.Plan(ctx, q, schema, migrations.Latest())
	if err != nil {
		return nil, err
	}
	applied := map[string]restore.Function{}
	for _, f := range now {
		applied[f.Name] = f
	}
	var out []FunctionCheck
	for _, l := range latest {
		f, ok := applied[l.Name]
		if !ok {
			f = l // no fix of it applied yet
		}
		c := FunctionCheck{Name: l.Name, Definition: f.Definition, Fingerprint: f.Fingerprint, Definitions: 1, Note: unreleasedNote(l.Name, f.Fingerprint)}
		switch {
		case f.Action == restore.Absent:
			continue
		case f.Action == restore.Unknown && f.Fingerprint == "":
			c.Verdict, c.Definitions = Missing, definitionCount(f.Problem)
			if _, added := addedBy(l.Name); added && !ok {
				continue // the fix that adds it is not applied: nothing to check
			}
		case f.Action == restore.Unknown:
			c.Verdict = Unknown
		case !ok:
			c.Verdict, c.FixedBy = Unfixed, l.Fix
			if l.Action == restore.Left {
				c.Verdict = Left
			}
		case f.Action == restore.InForce:
			c.Verdict, c.FixedBy = Fixed, f.Fix
		case f.Action == restore.Restore:
			c.Verdict, c.FixedBy = Replaced, f.Fix
		case l.Action == restore.Left:
			c.Verdict = Left
		default: // left at goose's version, served by a later fix
			c.Verdict, c.FixedBy = Unfixed, l.Fix
		}
		out = append(out, c)
	}
	return out, nil
}

// definitionCount is the number of definitions a restore problem names
// ("no definition", "2 definitions (overloads)").
func definitionCount(problem string) int {
	var n int
	if _, err := fmt.Sscanf(problem, "%d definitions", &n); err == nil {
		return n
	}
	return 0
}

// addedBy is the fix migration whose Adds line names function name.
func addedBy(name string) (migrations.Migration, bool) {
	for _, m := range migrations.Fixes() {
		if slices.Contains(m.Adds, "function "+name) {
			return m, true
		}
	}
	return migrations.Migration{}, false
}

// unreleasedNote is the note of the unreleased upstream migration whose
// text of function name has fingerprint fp ("" for none).
func unreleasedNote(name, fp string) string {
	if fp == "" {
		return ""
	}
	for _, u := range fingerprint.UnreleasedMigrations() {
		if fingerprint.NameOf(u.Function) == name && slices.Contains(slices.Collect(maps.Values(u.Fingerprints)), fp) {
			return u.Note
		}
	}
	return ""
}

// AllFixed reports whether every function the pack fixes has its fix.
func AllFixed(fs []FunctionCheck) bool {
	for _, f := range fs {
		if f.Verdict != Fixed {
			return false
		}
	}
	return len(fs) > 0
}

// judge adds the finding of one fixed function.
func judge(f FunctionCheck, s string, r *Report, add func(sev, check, msg, action string)) {
	up := fmt.Sprintf("harness migrate up --schema %s", s)
	show := fmt.Sprintf("inspect it with `SELECT pg_get_functiondef('%s.%s'::regproc)`", pgx.Identifier{s}.Sanitize(), f.Name)
	what := f.Definition
	if f.Note != "" {
		what += " (" + f.Note + ")"
	}
	switch f.Verdict {
	case Fixed:
		add(OK, f.Name, fmt.Sprintf("%s (%s)", f.Definition, f.FixedBy), "")
	case Missing:
		msg := fmt.Sprintf("%s does not exist: duroxide-pg cannot run", f.Name)
		action := "run `" + up + "`"
		if f.Definitions > 1 {
			msg = fmt.Sprintf("%d overloads of %s exist; duroxide-pg expects one", f.Definitions, f.Name)
			action = "drop the ones duroxide-pg does not call (`\\df " + s + "." + f.Name + "` in psql), then re-run doctor"
		}
		add(Critical, f.Name, msg, action)
	case Replaced:
		add(Warning, f.Name, fmt.Sprintf("%s: duroxide-pg's runner replaced the fix (goose records %s as applied)", what, f.FixedBy),
			"run `"+up+"`: it puts the fix back (`harness sql up` writes the same for psql; sql/restore/ for the stock goose CLI)")
	case Unfixed:
		next := "run `" + up + "`"
		if r.GooseVersion == nil {
			next = fmt.Sprintf("run `harness baseline --schema %s` (try --dry-run first), then `%s`", s, up)
		}
		add(Warning, f.Name, fmt.Sprintf("%s, without the pack's fix (%s is not applied)", what, f.FixedBy), next)
	case Left:
		add(Warning, f.Name, fmt.Sprintf("%s: upstream changed it in a way this pack has no fix for yet; left as it is", what),
			"nothing to run: a release of the pack that knows the change will fix it (`harness migrate up` then); meanwhile it runs upstream's definition")
	default:
		add(Critical, f.Name, fmt.Sprintf("an unknown definition of %s (neither upstream's at any version nor the pack's), e.g. edited by hand or from a newer duroxide-pg", f.Name),
			show+"; the pack's migrations refuse to replace it, so that nothing undoes a change they do not know: compare it with upstream's and the pack's texts and restore a known one")
	}
}

func checkQueue(ctx context.Context, q Querier, s string, opts Options, r *Report, add func(sev, check, msg, action string)) error {
	qual := func(name string) string { return pgx.Identifier{s, name}.Sanitize() }
	rows, err := q.QueryContext(ctx, `
SELECT instance_id, count(*), max(attempt_count), min(visible_at)
FROM `+qual("orchestrator_queue")+`
WHERE attempt_count > $1
GROUP BY instance_id
ORDER BY max(attempt_count) DESC, instance_id`, opts.MaxAttempts)
	if err != nil {
		return fmt.Errorf("read orchestrator_queue: %w", err)
	}
	var msgs int64
	for rows.Next() {
		var tr Trapped
		if err := rows.Scan(&tr.InstanceID, &tr.Messages, &tr.MaxAttemptCount, &tr.OldestVisibleAt); err != nil {
			rows.Close()
			return err
		}
		msgs += tr.Messages
		r.Trapped = append(r.Trapped, tr)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	r.TrappedMessages = msgs
	if err := q.QueryRowContext(ctx, `SELECT coalesce(max(attempt_count), 0) FROM `+qual("orchestrator_queue")).Scan(&r.MaxAttemptCount); err != nil {
		return fmt.Errorf("read orchestrator_queue: %w", err)
	}
	if len(r.Trapped) > 0 {
		add(Warning, "trapped", fmt.Sprintf("%d message(s) of %d instance(s) were fetched more than %d times (worst: %s, %d attempts)",
			msgs, len(r.Trapped), opts.MaxAttempts, r.Trapped[0].InstanceID, r.Trapped[0].MaxAttemptCount),
			fmt.Sprintf("after the fix is installed, let them run again: `harness doctor --schema %s --reset-attempts INSTANCE... --apply`", s))
	} else {
		add(OK, "trapped", fmt.Sprintf("no message fetched more than %d times", opts.MaxAttempts), "")
	}
	r.TrappedInstances = len(r.Trapped)
	if len(r.Trapped) > opts.ListLimit {
		r.Trapped = r.Trapped[:opts.ListLimit]
	}

	if err := checkWorkerQueue(ctx, q, s, opts, r, add); err != nil {
		return err
	}

	leases := func(where string) ([]Lease, error) {
		rows, err := q.QueryContext(ctx, `
SELECT l.instance_id, l.locked_until,
       (extract(epoch FROM clock_timestamp()) * 1000)::bigint - l.locked_until
FROM `+qual("instance_locks")+` l
WHERE `+where+`
ORDER BY l.locked_until, l.instance_id`)
		if err != nil {
			return nil, fmt.Errorf("read instance_locks: %w", err)
		}
		defer rows.Close()
		out := []Lease{}
		for rows.Next() {
			var l Lease
			if err := rows.Scan(&l.InstanceID, &l.LockedUntil, &l.ExpiredForMs); err != nil {
				return nil, err
			}
			out = append(out, l)
		}
		return out, rows.Err()
	}
	if r.ExpiredLeases, err = leases(`l.locked_until < (extract(epoch FROM clock_timestamp()) * 1000)::bigint`); err != nil {
		return err
	}
	if n := len(r.ExpiredLeases); n > 0 {
		add(Warning, "expired_leases", fmt.Sprintf("%d instance lock(s) expired but still held (oldest: %s, %s ago)",
			n, r.ExpiredLeases[0].InstanceID, time.Duration(r.ExpiredLeases[0].ExpiredForMs)*time.Millisecond),
			"harmless when few and short-lived (the next fetch takes them over); many or old ones mean dispatchers died or acks fail: check dispatcher logs for 'Invalid lock token'")
	} else {
		add(OK, "expired_leases", "no expired lease still held", "")
	}
	if r.OrphanLocks, err = leases(`NOT EXISTS (SELECT 1 FROM ` + qual("orchestrator_queue") + ` q WHERE q.instance_id = l.instance_id)`); err != nil {
		return err
	}
	if n := len(r.OrphanLocks); n > 0 {
		add(Warning, "orphan_locks", fmt.Sprintf("%d instance lock(s) without any orchestrator message (first: %s)", n, r.OrphanLocks[0].InstanceID),
			"expired ones are safe to delete from instance_locks; live ones belong to a dispatcher still processing")
	} else {
		add(OK, "orphan_locks", "every instance lock has messages", "")
	}
	r.ExpiredLeases = r.ExpiredLeases[:min(len(r.ExpiredLeases), opts.ListLimit)]
	r.OrphanLocks = r.OrphanLocks[:min(len(r.OrphanLocks), opts.ListLimit)]
	return nil
}

// checkWorkerQueue counts the worker items fetched more than MaxAttempts
// times (worker_queue has attempt_count from version 3 and instance_id from
// version 9; an older schema is not checked).
func checkWorkerQueue(ctx context.Context, q Querier, s string, opts Options, r *Report, add func(sev, check, msg, action string)) error {
	table := pgx.Identifier{s, "worker_queue"}.Sanitize()
	var columns int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = to_regclass($1) AND attname IN ('attempt_count', 'instance_id') AND NOT attisdropped`, table).Scan(&columns); err != nil {
		return fmt.Errorf("read worker_queue's columns: %w", err)
	}
	if columns < 2 {
		return nil
	}
	var worst sql.NullString
	if err := q.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE attempt_count > $1),
		count(DISTINCT instance_id) FILTER (WHERE attempt_count > $1),
		coalesce(max(attempt_count), 0),
		(SELECT instance_id FROM `+table+` WHERE attempt_count > $1 ORDER BY attempt_count DESC, id LIMIT 1)
		FROM `+table, opts.MaxAttempts).Scan(&r.WorkerTrappedItems, &r.WorkerTrappedInstances, &r.WorkerMaxAttemptCount, &worst); err != nil {
		return fmt.Errorf("read worker_queue: %w", err)
	}
	if r.WorkerTrappedItems == 0 {
		add(OK, "worker_trapped", fmt.Sprintf("no worker item fetched more than %d times", opts.MaxAttempts), "")
		return nil
	}
	add(Warning, "worker_trapped", fmt.Sprintf("%d worker item(s) of %d instance(s) were fetched more than %d times (worst: %s, %d attempts)",
		r.WorkerTrappedItems, r.WorkerTrappedInstances, opts.MaxAttempts, worst.String, r.WorkerMaxAttemptCount),
		fmt.Sprintf("after the fix is installed, let them run again: `harness doctor --schema %s --reset-attempts INSTANCE... --apply` (it resets the instance's worker items too)", s))
	return nil
}
