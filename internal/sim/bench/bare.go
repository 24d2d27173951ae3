package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// The bare queue: the classic single-statement dequeue on the same
// orchestrator_queue, with no instance lock, no history and no
// function call, as the practical upper bound for one fetch+ack cycle on
// the machine. Each worker has its own connection and loops:
//
//	fetch: UPDATE orchestrator_queue SET lock_token, locked_until,
//	       attempt_count + 1 WHERE id = (SELECT id ... visible, unlocked
//	       ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING ...
//	ack:   DELETE the row by id and token, and (same statement) INSERT the
//	       instance's next message, so the queue stays as full as the
//	       dispatchers' (each of their acks enqueues the next message).
//
// No row: it sleeps out the rest of the poll interval, like a dispatcher.

func bareFetchSQL(schema string) string {
	q := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	return "UPDATE " + q + " SET lock_token = $1, locked_until = $2 + $3, attempt_count = attempt_count + 1 " +
		"WHERE id = (SELECT id FROM " + q + " WHERE visible_at <= to_timestamp($2 / 1000.0) " +
		"AND (lock_token IS NULL OR locked_until <= $2) ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) " +
		"RETURNING id, locked_until, attempt_count"
}

func bareAckSQL(schema string) string {
	q := pgx.Identifier{schema, "orchestrator_queue"}.Sanitize()
	return "WITH done AS (DELETE FROM " + q + " WHERE id = $1 AND lock_token = $2 RETURNING instance_id, work_item) " +
		"INSERT INTO " + q + " (instance_id, work_item, visible_at, created_at) " +
		"SELECT instance_id, work_item, to_timestamp($3 / 1000.0), to_timestamp($3 / 1000.0) FROM done"
}

type bareStats struct {
	rowLat, emptyLat, ackLat []int64
	cycles, fetches, empties int
	fetchErrs, dead, ackFail int
	maxAttempt               int
}

// runBare runs n bare workers on schema for d and returns their sample
// (CPU not set).
func runBare(ctx context.Context, src *dbconn.Source, schema string, n int, d, lockTimeout, poll time.Duration) (Sample, error) {
	conns := make([]*pgx.Conn, n)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.Background())
			}
		}
	}()
	for i := range conns {
		var err error
		if conns[i], err = src.Connect(ctx); err != nil {
			return Sample{}, fmt.Errorf("bare: connect worker %d: %w", i+1, err)
		}
	}
	fetchSQL, ackSQL := bareFetchSQL(schema), bareAckSQL(schema)
	runCtx, stop := context.WithTimeout(ctx, d)
	defer stop()
	stats := make([]bareStats, n)
	errs := make([]error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = bareWorker(runCtx, conns[i], fetchSQL, ackSQL, lockTimeout, poll, &stats[i])
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return Sample{}, err
	}
	var all bareStats
	for i, st := range stats {
		if errs[i] != nil {
			return Sample{}, fmt.Errorf("bare worker %d: %w", i+1, errs[i])
		}
		all.rowLat = append(all.rowLat, st.rowLat...)
		all.emptyLat = append(all.emptyLat, st.emptyLat...)
		all.ackLat = append(all.ackLat, st.ackLat...)
		all.cycles += st.cycles
		all.fetches += st.fetches
		all.empties += st.empties
		all.fetchErrs += st.fetchErrs
		all.dead += st.dead
		all.ackFail += st.ackFail
		all.maxAttempt = max(all.maxAttempt, st.maxAttempt)
	}
	s := Sample{ElapsedS: elapsed.Seconds(), Cycles: all.cycles, Fetches: all.fetches,
		EmptyFetches: all.empties, FetchErrors: all.fetchErrs}
	s.finish(all.rowLat, all.emptyLat, all.dead, all.ackFail, all.maxAttempt)
	s.AckP50Ms = percentileMs(all.ackLat, 50)
	return s, nil
}

func bareWorker(ctx context.Context, conn *pgx.Conn, fetchSQL, ackSQL string, lockTimeout, poll time.Duration, st *bareStats) error {
	var tok [16]byte
	for ctx.Err() == nil {
		_, _ = rand.Read(tok[:])
		token := hex.EncodeToString(tok[:])
		iter := time.Now()
		now := iter.UnixMilli()
		var id, lockedUntil int64
		var attempt int32
		err := conn.QueryRow(ctx, fetchSQL, token, now, lockTimeout.Milliseconds()).Scan(&id, &lockedUntil, &attempt)
		lat := time.Since(iter).Microseconds()
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, pgx.ErrNoRows):
			st.empties++
			st.emptyLat = append(st.emptyLat, lat)
			if rest := poll - time.Since(iter); rest > 0 {
				t := time.NewTimer(rest)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
			continue
		case err != nil:
			st.fetchErrs++
			if st.fetchErrs > 100 {
				return err
			}
			continue
		}
		st.fetches++
		st.rowLat = append(st.rowLat, lat)
		st.maxAttempt = max(st.maxAttempt, int(attempt))
		if lockedUntil <= time.Now().UnixMilli() {
			st.dead++
		}
		// The ack may finish after the run's end, as a dispatcher's turn
		// may.
		ackStart := time.Now()
		tag, err := conn.Exec(context.WithoutCancel(ctx), ackSQL, id, token, ackStart.UnixMilli())
		st.ackLat = append(st.ackLat, time.Since(ackStart).Microseconds())
		if err != nil || tag.RowsAffected() != 1 {
			st.ackFail++
			continue
		}
		st.cycles++
	}
	return nil
}
