package baseline

import (
	"context"
	"database/sql"
)

// The steps of Run that read or write a database, for steps_db_test.go
// (package baseline_test, which has the throwaway databases).

// CheckCatalog runs checkCatalog; reason is "" when the catalog is
// upstream's.
func CheckCatalog(ctx context.Context, tx *sql.Tx, schema, versionTable string, state int64) (reason, diff string, err error) {
	d, err := checkCatalog(ctx, tx, schema, versionTable, state)
	if d == nil {
		return "", "", err
	}
	return d.reason, d.diff, err
}

// CheckBodies runs checkBodies with no unreleased version; reason is ""
// when every body is known. It returns how many functions it read.
func CheckBodies(ctx context.Context, tx *sql.Tx, schema string, state int64) (functions int, reason, diff string, err error) {
	funcs, d, err := checkBodies(ctx, tx, schema, state, nil)
	if d == nil {
		return len(funcs), "", "", err
	}
	return len(funcs), d.reason, d.diff, err
}

// ReadHistoryState runs readHistory and returns the state it found.
func ReadHistoryState(ctx context.Context, tx *sql.Tx, schema string) (int64, error) {
	h, err := readHistory(ctx, tx, schema)
	return h.state, err
}

// ReadGooseNewest runs readGoose and returns the newest version (-1: no
// table).
func ReadGooseNewest(ctx context.Context, tx *sql.Tx, schema, table string) (int64, error) {
	g, err := readGoose(ctx, tx, schema, table)
	return g.newest(), err
}

// Record runs record.
var Record = record
