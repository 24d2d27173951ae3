package migrations_test

// plpgsql_check (Debian: postgresql-15-plpgsql-check) on every PL/pgSQL
// function of the pack, at every pack version: errors, warnings, extra
// warnings (unused or shadowed variables and parameters), performance
// warnings (hidden casts, volatility) and security warnings (dynamic SQL
// open to injection). What it reports must be one of the listed
// exceptions, each harmless for the reason it gives.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	migrations "github.com/duroxide-pg/migrations"
)

// envRequirePlpgsqlCheck, set to 1 (CI), turns a server without the
// extension from a skip into a failure.
const envRequirePlpgsqlCheck = "HARNESS_REQUIRE_PLPGSQL_CHECK"

// plpgsqlCheckException is a report plpgsql_check makes that is harmless.
type plpgsqlCheckException struct {
	// upTo is the last pack version the exception applies to (0: all).
	upTo     int64
	function string // "" for any function
	level    string
	message  string // a substring of the message
	detail   string // a substring of the detail ("" for any)
	why      string
}

var plpgsqlCheckExceptions = []plpgsqlCheckException{
	{upTo: 2, level: "error", message: "attempt_count does not exist",
		why: "upstream's 0002 as upstream ships it: upstream edited it after 0003 existed, so its fetch and abandon functions use attempt_count, which 0003 adds; they fail only in a database left at version 2, which upstream's runner never leaves (it applies every version in one run)"},
	{upTo: 19, function: "fetch_orchestration_item", level: "warning extra", message: `never read variable "v_found_instance"`,
		why: "the ports' fetch of versions 3 to 19 assigns it and never reads it: dead, harmless; the ports' texts are published and fingerprinted (doctor and the guards know them as the pack's ports), so they stay as they are; the fixes from 0020 on do not have it"},
	{level: "performance", message: "routine is marked as VOLATILE, should be STABLE",
		why: "upstream's attributes: every function keeps upstream's volatility (VOLATILE, the default), which the catalog tests compare; the runtime calls each in its own statement, where STABLE would buy nothing"},
	{level: "performance", message: "target type is different type than source type", detail: `cast "integer" value to "bigint" type`,
		why: "an integer (a literal, a count, jsonb_array_length) assigned to a bigint variable or constant: a widening cast, exact, once per assignment"},
	{level: "warning", message: "target type is different type than source type", detail: `cast "text" value to "text[]" type`,
		why: "the literal '{}' initialising a text[] variable: plpgsql_check types the literal as text, PostgreSQL reads it as the empty array"},
	{function: "enqueue_orchestrator_work", level: "warning extra", message: "unused parameter",
		why: "upstream's signature: duroxide-pg passes the orchestration's name, version and execution id; upstream's body does not use them either"},
	{function: "ack_orchestration", level: "error", message: `column "completed_at" does not exist`,
		why: "upstream's dead routine of version 6, kept with its signature because upstream's catalog has it: it names instances.status and instances.completed_at, which never existed, and nothing calls it (duroxide-pg acks with ack_orchestration_item)"},
}

func (e plpgsqlCheckException) covers(version int64, function, level, message, detail string) bool {
	return (e.upTo == 0 || version <= e.upTo) && (e.function == "" || e.function == function) && e.level == level &&
		strings.Contains(message, e.message) && strings.Contains(detail, e.detail)
}

func TestEveryFunctionPassesPlpgsqlCheckAtEveryPackVersion(t *testing.T) {
	ctx := context.Background()
	probe := dbs.New(t, 0)
	conn, err := pgx.Connect(ctx, probe.DSN)
	require.NoError(t, err)
	var available bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'plpgsql_check')").Scan(&available))
	conn.Close(ctx)
	if !available {
		if os.Getenv(envRequirePlpgsqlCheck) == "1" {
			t.Fatalf("the server has no plpgsql_check extension (%s=1); Debian: apt-get install postgresql-15-plpgsql-check", envRequirePlpgsqlCheck)
		}
		t.Skip("the server has no plpgsql_check extension (Debian: apt-get install postgresql-15-plpgsql-check)")
	}
	used := map[int]bool{}
	for _, m := range migrations.MustPack() {
		t.Run(fmt.Sprintf("%04d", m.Version), func(t *testing.T) {
			db := dbs.New(t, m.Version)
			conn, err := pgx.Connect(ctx, db.DSN)
			require.NoError(t, err)
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS plpgsql_check")
			require.NoError(t, err)
			// Trigger functions are checked against orchestrator_queue, with
			// the transition tables their triggers declare.
			rows, err := conn.Query(ctx, `
SELECT p.proname::text, coalesce(r.level, ''), coalesce(r.message, ''), coalesce(r.detail, ''), coalesce(r.lineno, 0)
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
CROSS JOIN LATERAL plpgsql_check_function_tb(p.oid,
    relid => CASE WHEN p.prorettype = 'trigger'::regtype THEN to_regclass(quote_ident(n.nspname) || '.orchestrator_queue') ELSE 0 END,
    oldtable => (SELECT t.tgoldtable FROM pg_trigger t WHERE t.tgfoid = p.oid LIMIT 1),
    newtable => (SELECT t.tgnewtable FROM pg_trigger t WHERE t.tgfoid = p.oid LIMIT 1),
    performance_warnings => true, extra_warnings => true, security_warnings => true) r
WHERE n.nspname = $1
ORDER BY 1, 5`, db.Schema)
			require.NoError(t, err)
			defer rows.Close()
			for rows.Next() {
				var fn, level, message, detail string
				var line int
				require.NoError(t, rows.Scan(&fn, &level, &message, &detail, &line))
				covered := false
				for i, e := range plpgsqlCheckExceptions {
					if e.covers(m.Version, fn, level, message, detail) {
						covered, used[i] = true, true
						break
					}
				}
				require.True(t, covered, "%s line %d: %s: %s (%s): not a listed exception", fn, line, level, message, detail)
			}
			require.NoError(t, rows.Err())
		})
	}
	for i, e := range plpgsqlCheckExceptions {
		require.True(t, used[i], "exception no version needs any more: %+v", e)
	}
}
