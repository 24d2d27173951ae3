package repro

// The lease probe: the server's own record of every instance lease an
// orchestration fetch hands out on a side's schema, for the runtime repros.
// The runtime is not ours to change, and its log says when an ack was
// refused, not which fetch made the lease nor how stale its timestamp was.
// The probe is a trigger on the side's instance_locks: each row an
// orchestration fetch writes (current_query() names
// fetch_orchestration_item) is copied, with the database clock of the
// write, into a table of the side's schema. Every side stores in
// locked_at the caller's clock as its fetch carries it (p_now_ms at
// upstream's latest; p_now_ms plus the time spent in the function at
// upstream's candidate and at the pack), so the database clock minus
// locked_at at the claim is how far behind the caller's timestamp was when
// the fetch took the instance: a wait for a pooled connection, for an
// advisory key, for a core. The last row the fetch's transaction wrote is
// the lease it returned: locked_until at or before the database clock of
// that write is a lease dead at return.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// FetchLeases are the leases the orchestration fetches of one run handed
// out, as the server saw them (the lease probe).
type FetchLeases struct {
	// Leases counts the fetches that returned a lease.
	Leases int `json:"leases"`
	// Stale counts those whose caller's timestamp was behind the database
	// clock by more than the lock timeout when the fetch claimed the
	// instance: the fetches that met the bug's condition. MaxStaleMs is
	// the largest such lag over every lease.
	Stale      int   `json:"stale"`
	MaxStaleMs int64 `json:"max_stale_ms"`
	// DeadAtReturn counts the leases whose end was at or before the
	// database clock when the fetch wrote them last (just before it
	// returned); StaleDead those of them that were Stale.
	DeadAtReturn int `json:"dead_at_return"`
	StaleDead    int `json:"stale_dead_at_return"`
}

// add sums two runs' leases.
func (l FetchLeases) add(o FetchLeases) FetchLeases {
	return FetchLeases{Leases: l.Leases + o.Leases, Stale: l.Stale + o.Stale, MaxStaleMs: max(l.MaxStaleMs, o.MaxStaleMs),
		DeadAtReturn: l.DeadAtReturn + o.DeadAtReturn, StaleDead: l.StaleDead + o.StaleDead}
}

// leaseProbe is the probe installed on one schema.
type leaseProbe struct {
	schema string
}

// The probe's objects in the side's schema.
const (
	probeTable    = "repro_fetch_leases"
	probeFunction = "repro_fetch_leases_record"
	probeTrigger  = "repro_fetch_leases"
)

// installLeaseProbe creates the probe in schema over conn (again, if an
// earlier run left one).
func installLeaseProbe(ctx context.Context, conn *pgx.Conn, schema string) (*leaseProbe, error) {
	q := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + q(probeTable) + ` (
			id bigserial PRIMARY KEY,
			txid bigint NOT NULL,
			instance_id text NOT NULL,
			lock_token text NOT NULL,
			locked_at bigint NOT NULL,
			locked_until bigint NOT NULL,
			clock_ms bigint NOT NULL)`,
		`CREATE OR REPLACE FUNCTION ` + q(probeFunction) + `() RETURNS trigger
		LANGUAGE plpgsql AS $probe$
		BEGIN
			IF position('fetch_orchestration_item' IN coalesce(current_query(), '')) > 0 THEN
				INSERT INTO ` + q(probeTable) + ` (txid, instance_id, lock_token, locked_at, locked_until, clock_ms)
				VALUES (txid_current(), NEW.instance_id, NEW.lock_token, NEW.locked_at, NEW.locked_until,
				        floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint);
			END IF;
			RETURN NULL;
		END
		$probe$`,
		`DROP TRIGGER IF EXISTS ` + pgx.Identifier{probeTrigger}.Sanitize() + ` ON ` + q("instance_locks"),
		`CREATE TRIGGER ` + pgx.Identifier{probeTrigger}.Sanitize() + ` AFTER INSERT OR UPDATE ON ` + q("instance_locks") +
			` FOR EACH ROW EXECUTE FUNCTION ` + q(probeFunction) + `()`,
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("lease probe on schema %s: %w", schema, err)
		}
	}
	return &leaseProbe{schema: schema}, nil
}

// mark is the probe's newest row id: read later, the rows after it are a
// run's.
func (p *leaseProbe) mark(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var id int64
	err := conn.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM `+pgx.Identifier{p.schema, probeTable}.Sanitize()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("lease probe on schema %s: %w", p.schema, err)
	}
	return id, nil
}

// read sums the leases recorded after row since: one per fetch
// transaction, its lag from its first row, its end from its last.
func (p *leaseProbe) read(ctx context.Context, conn *pgx.Conn, since int64, lockTimeoutMs int64) (FetchLeases, error) {
	var l FetchLeases
	err := conn.QueryRow(ctx, `
		WITH fetches AS (
			SELECT txid,
			       (array_agg(clock_ms - locked_at ORDER BY id))[1] AS lag_ms,
			       (array_agg(locked_until - clock_ms ORDER BY id DESC))[1] AS left_ms
			FROM `+pgx.Identifier{p.schema, probeTable}.Sanitize()+`
			WHERE id > $1
			GROUP BY txid)
		SELECT count(*),
		       count(*) FILTER (WHERE lag_ms > $2),
		       coalesce(max(lag_ms), 0),
		       count(*) FILTER (WHERE left_ms <= 0),
		       count(*) FILTER (WHERE lag_ms > $2 AND left_ms <= 0)
		FROM fetches`, since, lockTimeoutMs).Scan(&l.Leases, &l.Stale, &l.MaxStaleMs, &l.DeadAtReturn, &l.StaleDead)
	if err != nil {
		return l, fmt.Errorf("lease probe on schema %s: %w", p.schema, err)
	}
	return l, nil
}
