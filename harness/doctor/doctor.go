// Package doctor checks one duroxide schema the way an on-call engineer
// needs it: which migrations are applied (goose's and duroxide-pg's
// bookkeeping), whether fetch_orchestration_item is the fixed one (0020),
// messages trapped by the lease bug, stale instance locks, and the clock
// skew between this host and the database. Every finding has a severity and
// says what to do.
package doctor

import (
	"context"
	"crypto/md5"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/harness/migrate"
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

// Reference fingerprints of fetch_orchestration_item, as Fingerprint
// computes them (md5 of pg_get_functiondef with the schema replaced by
// @SCHEMA@). TestReferenceFingerprints applies the pack at 19 and at 20 and
// fails when these drift (an edited sql/0019 or sql/0020, or a PostgreSQL
// that prints definitions differently); it prints the new values to paste
// here: go test ./harness/doctor/ -run TestReferenceFingerprints.
const (
	FingerprintV19 = "c99e4e8f03b4765e05aa6967429fb1da"
	FingerprintV20 = "2c0fea768246269a15ea62dec7c2f817"
)

// Thresholds of the clock-skew check.
const (
	SkewWarning  = time.Second
	SkewCritical = 30 * time.Second
)

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
	// ListLimit caps the instances listed per finding (default 20).
	ListLimit int
}

// Report is the result of Check; its JSON form is for monitoring.
type Report struct {
	Schema string `json:"schema"`
	Status string `json:"status"`
	// GooseVersion is goose's newest applied version, nil without a goose
	// table.
	GooseVersion *int64 `json:"goose_version"`
	// UpstreamVersion is max(version) of _duroxide_migrations, nil without
	// that table.
	UpstreamVersion *int64        `json:"duroxide_migrations_version"`
	Function        FunctionCheck `json:"fetch_orchestration_item"`
	Trapped         []Trapped     `json:"trapped_messages"`
	ExpiredLeases   []Lease       `json:"expired_leases"`
	OrphanLocks     []Lease       `json:"locks_without_messages"`
	ClockSkewMs     int64         `json:"clock_skew_ms"`
	MaxAttempts     int           `json:"max_attempts"`
	Findings        []Finding     `json:"findings"`
}

// FunctionCheck identifies the installed fetch_orchestration_item.
type FunctionCheck struct {
	// Verdict: "fixed" (0020), "bug" (0019), "unknown" (another
	// definition), "missing".
	Verdict     string `json:"verdict"`
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
	if opts.Schema == "" {
		opts.Schema = migrate.DefaultSchema
	}
	if opts.VersionTable == "" {
		opts.VersionTable = migrate.VersionTable
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 10
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ListLimit <= 0 {
		opts.ListLimit = 20
	}
	r := &Report{Schema: opts.Schema, MaxAttempts: opts.MaxAttempts,
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
	case *r.GooseVersion < 20:
		add(Warning, "migrations", fmt.Sprintf("goose is at version %d; the pack has 20", *r.GooseVersion),
			fmt.Sprintf("run `harness migrate up --schema %s`", s))
	default:
		add(OK, "migrations", fmt.Sprintf("goose at version %d", *r.GooseVersion), "")
	}

	// fetch_orchestration_item.
	if err := checkFunction(ctx, q, s, r, add); err != nil {
		return nil, err
	}

	// Queue and locks.
	if hasQueue {
		if err := checkQueue(ctx, q, s, opts, r, add); err != nil {
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
	case skew >= SkewCritical:
		add(Critical, "clock", msg, fix)
	case skew >= SkewWarning:
		add(Warning, "clock", msg, fix)
	default:
		add(OK, "clock", msg, "")
	}
	return r.finish(), nil
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

const defQuery = `
SELECT pg_get_functiondef(p.oid), quote_ident($1), quote_literal($1)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1 AND p.proname = 'fetch_orchestration_item'
ORDER BY p.oid`

func checkFunction(ctx context.Context, q Querier, s string, r *Report, add func(sev, check, msg, action string)) error {
	rows, err := q.QueryContext(ctx, defQuery, s)
	if err != nil {
		return fmt.Errorf("read fetch_orchestration_item: %w", err)
	}
	defer rows.Close()
	var fps []string
	blocking := false
	for rows.Next() {
		var def, qi, ql string
		if err := rows.Scan(&def, &qi, &ql); err != nil {
			return err
		}
		norm := Normalize(def, qi, ql)
		fps = append(fps, md5hex(norm))
		if strings.Contains(norm, "pg_advisory_xact_lock(") {
			blocking = true
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	r.Function.Definitions = len(fps)
	const check = "fetch_orchestration_item"
	switch {
	case len(fps) == 0:
		r.Function.Verdict = "missing"
		add(Critical, check, "fetch_orchestration_item does not exist: no dispatcher can fetch work",
			fmt.Sprintf("run `harness migrate up --schema %s`", s))
		return nil
	case len(fps) > 1:
		r.Function.Verdict = "unknown"
		add(Critical, check, fmt.Sprintf("%d overloads of fetch_orchestration_item exist; duroxide-pg expects one", len(fps)),
			"drop the ones duroxide-pg does not call (`\\df "+s+".fetch_orchestration_item` in psql), then re-run doctor")
		return nil
	}
	r.Function.Fingerprint = fps[0]
	switch fps[0] {
	case FingerprintV20:
		r.Function.Verdict = "fixed"
		add(OK, check, "the fixed definition (pack 0020): leases are valid when returned", "")
	case FingerprintV19:
		r.Function.Verdict = "bug"
		add(Warning, check, "version 19's definition: a contended fetch can hand out a lease that is already expired (acks fail with 'Invalid lock token', attempt_count climbs)",
			fmt.Sprintf("run `harness migrate up --schema %s` to apply 0020 (run `harness baseline` first if goose has no table here)", s))
	default:
		r.Function.Verdict = "unknown"
		msg := "an unknown definition (neither pack 0019 nor 0020), e.g. replaced by a later duroxide-pg migration or by hand"
		if blocking {
			msg += "; it takes a blocking pg_advisory_xact_lock, like version 19: the lease bug is likely present"
		}
		show := fmt.Sprintf("inspect it with `SELECT pg_get_functiondef('%s.fetch_orchestration_item'::regproc)`", pgx.Identifier{s}.Sanitize())
		action := show + " and compare with sql/0020's Up; if it was edited by hand, re-apply 0020's Up (CREATE OR REPLACE FUNCTION) in a transaction"
		if r.UpstreamVersion != nil && *r.UpstreamVersion > 19 {
			msg += fmt.Sprintf("; _duroxide_migrations is at %d, so duroxide-pg's own later migrations ran here", *r.UpstreamVersion)
			action = show + "; do NOT re-apply the pack's 0020 blindly, it would undo what upstream's later version changed: check whether that version already has the fix (pg_try_advisory_xact_lock, SKIP LOCKED, lease computed just before returning) and if not port 0020's changes onto it"
		}
		add(Critical, check, msg, action)
	}
	return nil
}

// Normalize replaces the schema in a pg_get_functiondef text by @SCHEMA@:
// in the header's qualified name (qident: the quoted identifier) and in the
// SET search_path line (qlit: the quoted literal). The body is untouched.
func Normalize(def, qident, qlit string) string {
	def = strings.ReplaceAll(def, "\r\n", "\n")
	lines := strings.Split(def, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "AS ") {
			break
		}
		if strings.HasPrefix(l, "CREATE OR REPLACE FUNCTION ") {
			lines[i] = strings.Replace(l, " "+qident+".", " @SCHEMA@.", 1)
		}
		if strings.HasPrefix(l, " SET search_path TO ") {
			lines[i] = strings.ReplaceAll(l, qlit, "'@SCHEMA@'")
		}
	}
	return strings.Join(lines, "\n")
}

// Fingerprint is md5 of the normalised definition of fetch_orchestration_item
// in schema ("" when absent or overloaded).
func Fingerprint(ctx context.Context, q Querier, schema string) (string, error) {
	r := &Report{}
	if err := checkFunction(ctx, q, schema, r, func(string, string, string, string) {}); err != nil {
		return "", err
	}
	return r.Function.Fingerprint, nil
}

func md5hex(s string) string {
	h := md5.Sum([]byte(s))
	return hex.EncodeToString(h[:])
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
	if len(r.Trapped) > 0 {
		add(Warning, "trapped", fmt.Sprintf("%d message(s) of %d instance(s) were fetched more than %d times (worst: %s, %d attempts)",
			msgs, len(r.Trapped), opts.MaxAttempts, r.Trapped[0].InstanceID, r.Trapped[0].MaxAttemptCount),
			fmt.Sprintf("after the fix is installed, let them run again: `harness doctor --schema %s --reset-attempts INSTANCE... --apply`", s))
	} else {
		add(OK, "trapped", fmt.Sprintf("no message fetched more than %d times", opts.MaxAttempts), "")
	}
	if len(r.Trapped) > opts.ListLimit {
		r.Trapped = r.Trapped[:opts.ListLimit]
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
