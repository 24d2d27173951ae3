package worker

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// lockWatcher samples the database's backends every lockWatchInterval and
// records every fetch_work_item statement it sees waiting on a row lock
// (wait_event_type 'Lock', wait_event 'transactionid' or 'tuple': another
// transaction's row, such as a session row), with when the wait started.
// Waits on a relation extension lock ('extend'), which any insert or update
// can meet under write load, are not the defect and are left out.
type lockWatcher struct {
	conn  *pgx.Conn
	waits map[waitKey]int64 // -> wait start, epoch ms (database clock)
}

type waitKey struct {
	pid          uint32
	queryStartMs int64
}

func newLockWatcher(conn *pgx.Conn) *lockWatcher {
	return &lockWatcher{conn: conn, waits: map[waitKey]int64{}}
}

// The wait's start is pg_locks.waitstart (PostgreSQL 14 and later); where
// that column is missing, the first sample that saw the wait.
const (
	watchQuery = `SELECT a.pid, floor(extract(epoch FROM a.query_start) * 1000)::bigint,
       floor(extract(epoch FROM coalesce(min(l.waitstart), clock_timestamp())) * 1000)::bigint
FROM pg_stat_activity a LEFT JOIN pg_locks l ON l.pid = a.pid AND NOT l.granted
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.wait_event_type = 'Lock' AND a.wait_event IN ('transactionid', 'tuple')
  AND a.query LIKE '%fetch_work_item%'
GROUP BY a.pid, a.query_start`
	watchQueryNoWaitstart = `SELECT a.pid, floor(extract(epoch FROM a.query_start) * 1000)::bigint,
       floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
  AND a.wait_event_type = 'Lock' AND a.wait_event IN ('transactionid', 'tuple')
  AND a.query LIKE '%fetch_work_item%'`
)

// run samples until ctx ends.
func (lw *lockWatcher) run(ctx context.Context) error {
	query := watchQuery
	tick := time.NewTicker(lockWatchInterval)
	defer tick.Stop()
	for {
		err := lw.sample(ctx, query)
		if sqlState(err) == "42703" && query == watchQuery { // no waitstart column
			query = watchQueryNoWaitstart
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (lw *lockWatcher) sample(ctx context.Context, query string) error {
	rows, err := lw.conn.Query(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var pid uint32
		var queryStart, waitStart int64
		if err := rows.Scan(&pid, &queryStart, &waitStart); err != nil {
			return err
		}
		k := waitKey{pid, queryStart}
		if old, ok := lw.waits[k]; !ok || waitStart < old {
			lw.waits[k] = waitStart
		}
	}
	if err := rows.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// attribute marks each fetch that was seen waiting: a wait belongs to the
// first fetch of its backend that returned at or after the statement
// started (a connection runs one statement at a time), provided that fetch
// started about then.
func (lw *lockWatcher) attribute(events []Event) {
	byPID := map[uint32][]int{}
	for i, e := range events {
		if e.Kind == kindFetch && e.DBReturnMs > 0 {
			byPID[e.PID] = append(byPID[e.PID], i)
		}
	}
	for _, idx := range byPID {
		sort.Slice(idx, func(a, b int) bool { return events[idx[a]].DBReturnMs < events[idx[b]].DBReturnMs })
	}
	for k, start := range lw.waits {
		idx := byPID[k.pid]
		j := sort.Search(len(idx), func(j int) bool { return events[idx[j]].DBReturnMs >= k.queryStartMs })
		if j == len(idx) {
			continue
		}
		e := &events[idx[j]]
		if k.queryStartMs < e.DBReturnMs-e.LatencyUs/1000-20 {
			continue // a statement that failed; this fetch started later
		}
		e.Blocked = true
		e.BlockedMs = max(e.BlockedMs, e.DBReturnMs-start)
	}
}
