package dispatch

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/duroxide-pg/migrations/internal/dbconn"
)

// Calibration is the measurement behind a calibrated lock timeout.
type Calibration struct {
	Schema  string `json:"schema"`
	Samples int    `json:"samples"`
	// Fetch is the median of Samples uncontended fetches (FetchMs in ms).
	Fetch   time.Duration `json:"-"`
	FetchMs float64       `json:"fetch_ms"`
	// Factor is how many Fetch times the timeout lasts.
	Factor      float64       `json:"factor"`
	LockTimeout time.Duration `json:"-"`
	// LockTimeoutMs is Factor x Fetch, rounded up to 10 ms, within
	// [50 ms, 5 s].
	LockTimeoutMs int64 `json:"lock_timeout_ms"`
}

// Calibrate measures how long one uncontended fetch_orchestration_item of a
// seeded hot instance takes right now on schema (seeded with cfg, one
// dispatcher's connection, each lease abandoned again), and derives the
// lock timeout: factor x the median of 9 fetches, rounded up to 10 ms,
// within [50 ms, 5 s]. Why a timeout in fetch times, and why the median:
// docs/BENCH.md, "The calibrated lock timeout".
func Calibrate(ctx context.Context, src *dbconn.Source, schema string, cfg Config, factor float64) (Calibration, error) {
	if factor <= 0 {
		return Calibration{}, fmt.Errorf("dispatch: calibrate: factor %g: want > 0", factor)
	}
	cfg.Schema = schema
	cfg.LockTimeout = time.Minute
	cfg = cfg.WithDefaults()
	if _, err := Seed(ctx, src, cfg); err != nil {
		return Calibration{}, fmt.Errorf("dispatch: calibrate: %w", err)
	}
	const samples = 9
	lat, err := MeasureFetch(ctx, src, schema, samples)
	if err != nil {
		return Calibration{}, fmt.Errorf("dispatch: calibrate: %w", err)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	median := lat[samples/2]
	t := time.Duration(factor * float64(median))
	t = ((t + 10*time.Millisecond - 1) / (10 * time.Millisecond)) * (10 * time.Millisecond)
	t = min(max(t, 50*time.Millisecond), 5*time.Second)
	return Calibration{Schema: schema, Samples: samples, Fetch: median, Factor: factor,
		FetchMs: float64(median.Microseconds()) / 1000, LockTimeout: t, LockTimeoutMs: t.Milliseconds()}, nil
}
