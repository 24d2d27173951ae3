package bench

import (
	"context"
	"fmt"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
)

// hotLockTimeoutFactor is how many uncontended fetch times of the hot
// instance its lock timeout lasts. The hot cell judges dead-on-arrival
// leases (the caller's clock, delivery included), so the delivery of its
// 1.25 MB row must fit: the factor the organic repro used before its fix
// verdict stopped depending on the delivery.
const hotLockTimeoutFactor = 3.5

// calibrateHot measures the hot scenario's lock timeout the way the organic
// repro does (dispatch.Calibrate: hotLockTimeoutFactor x the median of 9
// uncontended fetches of the hot instance, on the lowest version's schema
// p, now, on this machine). A fixed small timeout is shorter than the
// delivery of the hot instance's ~1.25 MB row on a busy machine, so every
// version would show dead leases whatever its fetch does; a timeout in
// fetch times keeps "no dead lease after the fix" a fair target on a fast
// idle machine and on a slow busy one. Calibrate reseeds p with the same
// rows, so p's snapshot still describes it.
func calibrateHot(ctx context.Context, src *dbconn.Source, p prepared, cfg Config) (dispatch.Calibration, error) {
	cal, err := dispatch.Calibrate(ctx, src, p.schema, hotConfig(cfg), hotLockTimeoutFactor)
	if err != nil {
		return dispatch.Calibration{}, fmt.Errorf("bench: calibrate the hot lock timeout on %s: %w", p.schema, err)
	}
	return cal, nil
}
