package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/clock"
	"github.com/duroxide-pg/migrations/internal/sim/orch"
)

// scaleLockTimeoutMs is the lock timeout the scale fetches ask for: long
// enough that no lease taken during a measurement expires.
const scaleLockTimeoutMs = 30000

// measureScale runs one side of one round of cell c on schema.
func measureScale(ctx context.Context, src *dbconn.Source, schema string, c *ScaleCell, cfg Config, cpu *serverCPU) (scaleSample, error) {
	var s scaleSample
	switch c.Kind {
	case scaleIdleKind:
		return s, idlePolls(ctx, src, schema, c, cpu, &s)
	case scaleBlockedKind:
		if err := emptyFetches(ctx, src, schema, c.Calls, cpu, &s); err != nil {
			return s, err
		}
		return s, rowFetches(ctx, src, schema, c.Calls, c.Claimable, &s)
	case scaleCompletedKind:
		if err := emptyFetches(ctx, src, schema, c.Calls, cpu, &s); err != nil {
			return s, err
		}
		if err := cycles(ctx, src, schema, c.Calls, cpu, &s); err != nil {
			return s, err
		}
		if c.LargeHistory > 0 {
			return s, largeFetches(ctx, src, schema, c.Calls, &s)
		}
		return s, nil
	}
	return s, fmt.Errorf("bench: unknown scale cell kind %q", c.Kind)
}

// connect opens a fresh session (a fresh PL/pgSQL plan cache).
func connect(ctx context.Context, src *dbconn.Source, what string) (*pgx.Conn, error) {
	conn, err := src.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("scale: connect (%s): %w", what, err)
	}
	return conn, nil
}

// fetchNow is one fetch_orchestration_item call as the runtime makes it
// (caller's clock just before, the runtime's version filter), timed in µs.
func fetchNow(ctx context.Context, q orch.Querier, c orch.Client) (*orch.Item, int64, error) {
	start := time.Now()
	it, err := c.Fetch(ctx, q, start.UnixMilli(), scaleLockTimeoutMs, orch.RuntimeFilter())
	return it, time.Since(start).Microseconds(), err
}

// emptyFetches makes calls empty fetches (the schema holds nothing
// claimable) on one fresh session, autocommit like a dispatcher's idle
// poll, and records their early and steady latency and the server CPU per
// call. A call that returns a row after all is counted and its lease
// handed back, so that the next call sees the same queue.
func emptyFetches(ctx context.Context, src *dbconn.Source, schema string, calls int, cpu *serverCPU, s *scaleSample) error {
	conn, err := connect(ctx, src, "empty fetches")
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	c := orch.New(schema)
	lat := make([]int64, 0, calls)
	w := cpu.begin()
	for range calls {
		it, us, err := fetchNow(ctx, conn, c)
		if err != nil {
			return fmt.Errorf("scale: empty fetch: %w", err)
		}
		lat = append(lat, us)
		if it != nil {
			s.EmptyRowsReturned++
			if _, err := c.Abandon(ctx, conn, it.LockToken, time.Now().UnixMilli(), 0, true); err != nil {
				return fmt.Errorf("scale: hand back an unexpected row: %w", err)
			}
		}
	}
	if sec := w.end(); sec >= 0 {
		s.CPUMsPerPoll = fp(1000 * sec / float64(calls))
	}
	s.EmptyCalls = calls
	s.EmptyEarlyMs, s.EmptySteadyMs = phases(lat)
	return nil
}

// rowFetches queues one message for each of claimable ready instances
// behind the blocked ones and times calls one-row fetches
// (rolledBackFetches).
func rowFetches(ctx context.Context, src *dbconn.Source, schema string, calls, claimable int, s *scaleSample) error {
	lat, rows, err := rolledBackFetches(ctx, src, schema, calls, "one-row fetch", func(ctx context.Context, admin *pgx.Conn) error {
		return readyMessages(ctx, admin, schema, claimable)
	})
	s.RowCalls, s.RowRowsReturned = len(lat), rows
	s.RowEarlyMs, s.RowSteadyMs = phases(lat)
	return err
}

// largeFetches queues a message for the large-history instance and times
// calls fetches of it (rolledBackFetches): against the cycle's fetch of a
// small instance, the cost of loading a history.
func largeFetches(ctx context.Context, src *dbconn.Source, schema string, calls int, s *scaleSample) error {
	lat, rows, err := rolledBackFetches(ctx, src, schema, calls, "large-history fetch", func(ctx context.Context, admin *pgx.Conn) error {
		return bigMessage(ctx, admin, schema)
	})
	s.LargeCalls, s.LargeRowsReturned = len(lat), rows
	s.LargeEarlyMs, s.LargeSteadyMs = phases(lat)
	return err
}

// rolledBackFetches runs queue on a separate connection, then makes calls
// fetches on one fresh session, each in a transaction rolled back after it
// (so every call sees the same queue and claims the same instance), and
// takes the queued messages out again. It returns the latency of each
// call (µs) and how many returned a row.
func rolledBackFetches(ctx context.Context, src *dbconn.Source, schema string, calls int, what string,
	queue func(ctx context.Context, admin *pgx.Conn) error) ([]int64, int, error) {
	admin, err := connect(ctx, src, what+" setup")
	if err != nil {
		return nil, 0, err
	}
	defer admin.Close(context.Background())
	if err := queue(ctx, admin); err != nil {
		return nil, 0, err
	}
	conn, err := connect(ctx, src, what)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close(context.Background())
	c := orch.New(schema)
	lat := make([]int64, 0, calls)
	rows := 0
	for range calls {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return nil, 0, fmt.Errorf("scale: %s: begin: %w", what, err)
		}
		it, us, err := fetchNow(ctx, tx, c)
		if rbErr := tx.Rollback(context.Background()); err == nil && rbErr != nil {
			err = rbErr
		}
		if err != nil {
			return nil, 0, fmt.Errorf("scale: %s: %w", what, err)
		}
		lat = append(lat, us)
		if it != nil {
			rows++
		}
	}
	return lat, rows, clearReady(ctx, admin, schema)
}

// idlePolls runs c.Dispatchers idle dispatchers on their own sessions for
// c.DurationS: each calls the empty fetch, then sleeps out the rest of its
// poll interval, as the runtime's dispatcher does when there is no work.
// It records the server CPU per second of run, the polls completed per
// second and their median latency. Calls still running at the end are
// cancelled.
func idlePolls(ctx context.Context, src *dbconn.Source, schema string, c *ScaleCell, cpu *serverCPU, s *scaleSample) error {
	conns := make([]*pgx.Conn, c.Dispatchers)
	closeAll := func() {
		for i, conn := range conns {
			if conn != nil {
				_ = conn.Close(context.Background())
				conns[i] = nil
			}
		}
	}
	defer closeAll()
	for i := range conns {
		var err error
		if conns[i], err = connect(ctx, src, fmt.Sprintf("idle dispatcher %d", i+1)); err != nil {
			return err
		}
	}
	poll := time.Duration(c.PollIntervalMs) * time.Millisecond
	client := orch.New(schema)
	lat := make([][]int64, len(conns))
	rows := make([]int, len(conns))
	errs := make([]error, len(conns))
	done := make(chan int, len(conns))
	w := cpu.begin()
	start := time.Now()
	runCtx, stop := context.WithTimeout(ctx, time.Duration(c.DurationS*float64(time.Second)))
	defer stop()
	for i := range conns {
		go func() {
			defer func() { done <- i }()
			for runCtx.Err() == nil {
				iter := time.Now()
				it, us, err := fetchNow(runCtx, conns[i], client)
				if runCtx.Err() != nil {
					return
				}
				if err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], us)
				if it != nil {
					rows[i]++
				}
				clock.Sleep(runCtx, poll-time.Since(iter))
			}
		}()
	}
	for range conns {
		<-done
	}
	elapsed := time.Since(start)
	closeAll()
	sec := w.end()
	if err := ctx.Err(); err != nil {
		return err
	}
	var all []int64
	for i := range conns {
		if errs[i] != nil {
			return fmt.Errorf("scale: idle dispatcher %d: %w", i+1, errs[i])
		}
		all = append(all, lat[i]...)
		if rows[i] > 0 {
			return fmt.Errorf("scale: idle dispatcher %d fetched %d rows from a queue with nothing claimable", i+1, rows[i])
		}
	}
	s.ElapsedS = elapsed.Seconds()
	s.Polls = len(all)
	s.PollsPerS = fp(float64(len(all)) / s.ElapsedS)
	s.PollP50Ms = percentileMs(all, 50)
	if sec >= 0 {
		s.CPUSPerS = fp(sec / s.ElapsedS)
		if s.Polls > 0 {
			s.CPUMsPerIdlePoll = fp(1000 * sec / float64(s.Polls))
		}
	}
	return nil
}
