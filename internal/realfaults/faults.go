package realfaults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
)

// KillBackends terminates the runtimes' backends (pg_terminate_backend, as
// a failover, an idle-session timeout or a DBA would) at random: every
// MinGap to MaxGap, each of the runtimes' backends with probability Share.
type KillBackends struct {
	// Admin connects a session allowed to terminate the runtimes' backends.
	Admin          *dbconn.Source
	MinGap, MaxGap time.Duration
	Share          float64
}

// Name says what it does.
func (k KillBackends) Name() string {
	return fmt.Sprintf("backends terminated (each with probability %.2f, every %v-%v)", k.Share, k.MinGap, k.MaxGap)
}

// Inject terminates backends until ctx ends and returns how many it
// terminated.
func (k KillBackends) Inject(ctx context.Context, apps []string) (int, error) {
	if k.MinGap <= 0 || k.MaxGap < k.MinGap || k.Share <= 0 || k.Share > 1 {
		return 0, fmt.Errorf("KillBackends: gaps %v-%v and share %v: want 0 < min <= max and 0 < share <= 1", k.MinGap, k.MaxGap, k.Share)
	}
	conn, err := k.Admin.Connect(ctx)
	if err != nil {
		return 0, fmt.Errorf("KillBackends: %w", err)
	}
	defer conn.Close(context.Background())
	killed := 0
	for {
		gap := k.MinGap + rand.N(k.MaxGap-k.MinGap+1)
		select {
		case <-ctx.Done():
			return killed, nil
		case <-time.After(gap):
		}
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
			FROM pg_stat_activity
			WHERE application_name = ANY ($1) AND pid <> pg_backend_pid() AND random() < $2`,
			apps, k.Share).Scan(&n)
		if err != nil {
			if ctx.Err() != nil {
				return killed, nil
			}
			return killed, fmt.Errorf("KillBackends: %w", err)
		}
		killed += n
	}
}

// Restarter restarts a throwaway server (pgtest.Server.Restart: a fast
// shutdown, then a start on the same address).
type Restarter interface {
	Restart(ctx context.Context) error
}

// RestartServer stops the server (fast: every backend is terminated, the
// runtime's pools included) and starts it again, Times times, the first
// after First (zero: Gap) and each later one Gap after the server came
// back.
type RestartServer struct {
	Server Restarter
	// What names the server in the report (default "server").
	What  string
	Times int
	First time.Duration
	Gap   time.Duration
}

// Name says what it does.
func (r RestartServer) Name() string {
	return fmt.Sprintf("%s restarted %d times, %v apart", cmp.Or(r.What, "server"), r.Times, r.Gap)
}

// Inject restarts the server Times times, unless ctx ends first, and
// returns how many restarts it made. It waits for a restart it began even
// when ctx ends meanwhile: a server left stopped would fail everything
// after it.
func (r RestartServer) Inject(ctx context.Context, _ []string) (int, error) {
	if r.Times <= 0 || r.Gap <= 0 {
		return 0, errors.New("RestartServer: Times and Gap must be positive")
	}
	done := 0
	for done < r.Times {
		wait := r.Gap
		if done == 0 && r.First > 0 {
			wait = r.First
		}
		select {
		case <-ctx.Done():
			return done, nil
		case <-time.After(wait):
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		err := r.Server.Restart(rctx)
		cancel()
		if err != nil {
			return done, fmt.Errorf("RestartServer: %w", err)
		}
		done++
	}
	return done, nil
}

// ErrNoFaketime marks a machine without libfaketime (Debian: apt-get
// install faketime), which skewed clocks need (pgtest.ErrNoFaketime).
var ErrNoFaketime = pgtest.ErrNoFaketime

// faketimeEnv is the environment that sets a process's clock offset from
// the real one (nil for none): pgtest.FaketimeEnv, libfaketime preloaded,
// the monotonic clock left alone so that the runtime's timeouts and sleeps
// keep their length.
func faketimeEnv(offset time.Duration) ([]string, error) { return pgtest.FaketimeEnv(offset) }
