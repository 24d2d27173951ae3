package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/duroxide-pg/migrations/internal/dbconn"
	"github.com/duroxide-pg/migrations/internal/sim/dispatch"
	"github.com/duroxide-pg/migrations/internal/sim/simconfig"
	"github.com/duroxide-pg/migrations/internal/testenv/pgtest"
	"github.com/duroxide-pg/migrations/internal/testenv/testdb"
)

var dbs *testdb.Pool

func TestMain(m *testing.M) {
	os.Exit(testdb.RunTests(m, func(srv *pgtest.Server) {
		dbs = testdb.NewPool(srv, "duroxide")
	}))
}

func TestSkewIsSpreadUniformly(t *testing.T) {
	c := dispatch.Config{Skew: 100 * time.Millisecond}
	require.Equal(t, -100*time.Millisecond, c.SkewFor(0, 5))
	require.Equal(t, -50*time.Millisecond, c.SkewFor(1, 5))
	require.Equal(t, time.Duration(0), c.SkewFor(2, 5))
	require.Equal(t, 100*time.Millisecond, c.SkewFor(4, 5))
	require.Equal(t, time.Duration(0), dispatch.Config{}.SkewFor(3, 5))
}

func TestSummarizeCountsAndPercentiles(t *testing.T) {
	ev := []dispatch.Event{
		{Kind: dispatch.KindFetch, Outcome: dispatch.OutcomeEmpty, LatencyUs: 1000},
		{Kind: dispatch.KindFetch, Token: "a", Outcome: "ok", RemainingMs: -5, AttemptCount: 3, LatencyUs: 9000},
		{Kind: dispatch.KindFetch, Token: "b", Outcome: "ok", RemainingMs: 20, AttemptCount: 12, LatencyUs: 2000},
		{Kind: dispatch.KindFetch, Token: "c", Outcome: "ok", LeaseLost: true, AttemptCount: 1, LatencyUs: 3000},
		{Kind: dispatch.KindFetch, Outcome: "fetch_orchestration_item: ERROR: deadlock detected (SQLSTATE 40P01)", LatencyUs: 1000000},
		{Kind: dispatch.KindAck, Outcome: dispatch.OutcomeInvalidLockToken},
		{Kind: dispatch.KindFailAck, Outcome: dispatch.OutcomeInvalidLockToken},
		{Kind: dispatch.KindPoison, Outcome: dispatch.OutcomeOK},
		{Kind: dispatch.KindAck, Outcome: dispatch.OutcomeOK},
		{Kind: dispatch.KindAck, Outcome: dispatch.OutcomeOK, Detail: "terminal"},
	}
	s := dispatch.Summarize(ev, 2*time.Second, 10)
	require.Equal(t, 5, s.FetchCalls)
	require.Equal(t, 3, s.Fetches)
	require.Equal(t, 1, s.EmptyFetches)
	require.Equal(t, 1, s.FetchErrors)
	require.Equal(t, 1, s.Deadlocks)
	require.Contains(t, s.FirstError, "40P01")
	require.Equal(t, 2, s.DeadOnArrival) // -5 and the lost one
	require.InDelta(t, 66.67, s.DeadOnArrivalPct, 0.01)
	require.Equal(t, 1, s.LeasesLost)
	require.Equal(t, 4, s.AckCalls)
	require.Equal(t, 1, s.InvalidLockAcks)
	require.Equal(t, 1, s.CompletedTurns)
	require.Equal(t, 0.5, s.TurnsPerSec)
	require.Equal(t, 1, s.PoisonAcksOK)
	require.Equal(t, 1, s.FailAcks)
	require.Equal(t, 12, s.MaxAttemptCount)
	require.True(t, s.ExceededMaxAttempts)
	require.Equal(t, 2, s.RemainingSamples)
	require.Equal(t, int64(-5), s.RemainingP1Ms)
	require.Equal(t, int64(20), s.RemainingP99Ms)
	require.Equal(t, 3.0, s.FetchLatencyP50Ms)

	b, err := json.Marshal(s)
	require.NoError(t, err)
	for _, k := range []string{`"dead_on_arrival_pct"`, `"invalid_lock_acks"`, `"max_attempt_count"`, `"remaining_p50_ms"`, `"turns_per_s"`} {
		require.Contains(t, string(b), k)
	}
}

func TestSummarizeTellsDeadAtReturnFromExpiredInDelivery(t *testing.T) {
	const timeout = 100
	// fetch builds a fetch event: the function returned at db clock 1000
	// with a lease until lockedUntil; the row reached the caller with
	// remaining ms left by its clock, delivery ms after the return.
	fetch := func(token string, lockedUntil, remaining, delivery int64) dispatch.Event {
		return dispatch.Event{Kind: dispatch.KindFetch, Token: token, Outcome: dispatch.OutcomeOK,
			DBReturnMs: 1000, LockedUntilMs: lockedUntil, RemainingMs: remaining,
			LeaseAgeMs: timeout - remaining, DeliveryMs: delivery}
	}
	ev := []dispatch.Event{
		fetch("stale", 990, -20, 10),  // expired before the function returned
		fetch("slow", 1100, -50, 150), // whole at return, outlived by a 150 ms delivery
		fetch("short", 1030, -5, 40),  // alive at return, but expired in a 40 ms delivery: not whole
		fetch("fine", 1100, 90, 10),   // alive on arrival
		{Kind: dispatch.KindFetch, Token: "lost", Outcome: dispatch.OutcomeOK, LeaseLost: true},
		{Kind: dispatch.KindAck, Token: "fine", Outcome: dispatch.OutcomeInvalidLockToken},
		{Kind: dispatch.KindAck, Token: "slow", Outcome: dispatch.OutcomeInvalidLockToken},
		// taken over in a 60 ms delivery: it had at most 60 ms left at
		// return, so it had used at least 40
		{Kind: dispatch.KindFetch, Token: "lost-in-delivery", Outcome: dispatch.OutcomeOK, LeaseLost: true,
			DBReturnMs: 1000, DBAtReturnMs: 1060, DeliveryMs: 60},
	}
	s := dispatch.Summarize(ev, time.Second, 10)
	require.Equal(t, 6, s.Fetches)
	require.Equal(t, 5, s.DeadOnArrival, "stale, slow, short and both lost, by the caller's clock")
	require.Equal(t, 2, s.DeadAtReturn, "stale, and lost unread (counted as dead)")
	require.InDelta(t, 33.33, s.DeadAtReturnPct, 0.01)
	require.Equal(t, 3, s.ExpiredInDelivery, "slow, short and lost-in-delivery")
	require.Equal(t, 1, s.ExpiredInShortDelivery, "short: its delivery was shorter than the lock timeout")
	require.Equal(t, int64(150), s.DeliveryMaxMs)
	require.True(t, ev[7].LostInDelivery())
	require.False(t, ev[4].LostInDelivery(), "no clock read: not known to be lost after the return")
	// How much of its lease each fetch had used when the function
	// returned: stale 110 ms (100 - (990 - 1000)), short 70, slow and fine
	// 0; the lost ones have none of their own (lost-in-delivery is the
	// delivery's doing, counted apart).
	require.Equal(t, int64(timeout), s.LockTimeoutMs)
	require.Equal(t, 4, s.ReturnAgeSamples)
	require.Equal(t, int64(110), s.ReturnAgeMaxMs)
	require.Equal(t, int64(0), s.ReturnAgeP50Ms) // 0, 0, 70, 110
	require.Equal(t, 1, s.LostInDelivery)
	a, ok := ev[2].ReturnAgeMs()
	require.True(t, ok)
	require.Equal(t, int64(70), a)
	_, ok = ev[4].ReturnAgeMs()
	require.False(t, ok, "a lost lease has no age at return of its own")
	require.Equal(t, 2, s.InvalidLockAcks)
	require.Equal(t, 2, s.RefusedWhileValidAcks, "acks without a clock read are not shown to be late")
}

func TestSummarizeJudgesRefusedAcksByTheAcksClock(t *testing.T) {
	// Every lease: the function returned at db clock 1000 with a lease
	// until 1100; the row's delivery took delivery ms (lease read at 1000
	// + delivery).
	fetch := func(token string, delivery int64) dispatch.Event {
		return dispatch.Event{Kind: dispatch.KindFetch, Token: token, Outcome: dispatch.OutcomeOK,
			CallerBeforeMs: 990, CallerAfterMs: 1000 + delivery, DBReturnMs: 1000, DBAtReturnMs: 1000 + delivery,
			DeliveryMs: delivery, LockedUntilMs: 1100, RemainingMs: 100 - delivery, LeaseAgeMs: delivery}
	}
	// ack builds a refused ack: p_now_ms now, the database clock dbStart
	// and the token's locked_until lockedUntil (0: gone) read just before.
	ack := func(token string, now, dbStart, lockedUntil int64) dispatch.Event {
		return dispatch.Event{Kind: dispatch.KindAck, Token: token, Outcome: dispatch.OutcomeInvalidLockToken,
			CallerBeforeMs: now, AckDBStartMs: dbStart, AckLockedUntilMs: lockedUntil}
	}
	ev := []dispatch.Event{
		fetch("valid", 10), fetch("taken", 10), fetch("processing", 10), fetch("delivery", 150),
		fetch("callerclock", 10), fetch("edge", 10), fetch("gone-late", 10),
		{Kind: dispatch.KindFetch, Token: "lost", Outcome: dispatch.OutcomeOK, DBReturnMs: 1000, LeaseLost: true},
		ack("valid", 1050, 1050, 1100),       // the row was there and valid: refused while valid
		ack("taken", 1050, 1050, 0),          // taken over (gone) before its end at 1100: refused while valid
		ack("processing", 1120, 1130, 1100),  // ran out while the turn ran: 30 ms late
		ack("delivery", 1160, 1160, 1100),    // ran out in a 150 ms delivery: 60 ms late
		ack("callerclock", 1105, 1095, 1100), // by its own p_now_ms (ahead of the db): 5 ms late
		ack("edge", 1100, 1100, 1100),        // locked_until > now is the ack's rule: at 1100 it has run out
		ack("gone-late", 1200, 1200, 0),      // gone before the ack, after its end at 1100: 100 ms late
		ack("lost", 1200, 1200, 0),           // taken over before its fetch read it: dead at return
		{Kind: dispatch.KindFailAck, Token: "processing", Outcome: dispatch.OutcomeInvalidLockToken, AckDBStartMs: 1000},
		// taken over between its return and its read 150 ms later
		{Kind: dispatch.KindFetch, Token: "lost-in-delivery", Outcome: dispatch.OutcomeOK, DBReturnMs: 1000,
			DBAtReturnMs: 1150, DeliveryMs: 150, LeaseLost: true},
		ack("lost-in-delivery", 1200, 1200, 0),
	}
	s := dispatch.Summarize(ev, time.Second, 10)
	require.Equal(t, 9, s.InvalidLockAcks, "first acks only")
	require.Equal(t, 2, s.RefusedWhileValidAcks, "valid and taken")
	require.Equal(t, 7, s.RefusedLateAcks)
	require.Equal(t, 1, s.LateAtReturn, "lost, its read failed")
	require.Equal(t, 2, s.LateInDelivery, "delivery, lost-in-delivery")
	require.Equal(t, 4, s.LateInProcessing, "processing, callerclock, edge, gone-late")
	require.Equal(t, 5, s.LatenessSamples, "lost has no known end")
	require.Equal(t, int64(0), s.LatenessMinMs)
	require.Equal(t, int64(30), s.LatenessP50Ms) // 0, 5, 30, 60, 100
	require.Equal(t, int64(100), s.LatenessMaxMs)
	// Processing (db clock from the lease read at 1010 to the ack's read):
	// 120, 85, 90, 190.
	require.Equal(t, int64(90), s.LateProcessingP50Ms)
	require.Equal(t, int64(190), s.LateProcessingMaxMs)

	r := ev[9].RefusedAck(&ev[1]) // taken, with its fetch
	require.Equal(t, dispatch.Refusal{Cause: dispatch.RefusedWhileValid, ClockMs: 1050, LockedUntilMs: 1100}, r)
	r = ev[10].RefusedAck(&ev[2])
	require.Equal(t, dispatch.Refusal{Cause: dispatch.RefusedLateInProcessing, ClockMs: 1130, LockedUntilMs: 1100,
		LatenessMs: 30, ProcessingMs: 120}, r)
	require.Equal(t, dispatch.RefusedLate, ev[10].RefusedAck(nil).Cause, "no fetch known: late, where unknown")
	require.Equal(t, dispatch.RefusedWhileValid, ev[9].RefusedAck(nil).Cause, "gone, its end unknown: not shown late")

	b, err := json.Marshal(s)
	require.NoError(t, err)
	for _, k := range []string{`"refused_acks_valid_when_run"`, `"refused_acks_late"`, `"refused_acks_late_lateness_p50_ms"`,
		`"refused_acks_late_expired_in_processing"`} {
		require.Contains(t, string(b), k)
	}
}

func TestConservationFindsLostAndDoubledMessages(t *testing.T) {
	ok := []dispatch.Event{
		{Kind: dispatch.KindAck, Outcome: "ok", Messages: []string{"m-0-0"}, Enqueued: []string{"m-1-1"}},
		{Kind: dispatch.KindAck, Outcome: dispatch.OutcomeInvalidLockToken, Messages: []string{"m-1-1"}},
	}
	require.NoError(t, dispatch.Conservation([]string{"m-0-0"}, ok, []string{"m-1-1"}))
	require.ErrorContains(t, dispatch.Conservation([]string{"m-0-0"}, ok, nil), "m-1-1 consumed 0 times, pending 0 times")
	doubled := append(ok, dispatch.Event{Kind: dispatch.KindPoison, Outcome: "ok", Messages: []string{"m-0-0"}})
	require.ErrorContains(t, dispatch.Conservation([]string{"m-0-0"}, doubled, []string{"m-1-1"}), "m-0-0 consumed 2 times")
}

// newDB returns a fresh database at version: its connections and schema.
func newDB(t *testing.T, version int64) (src *dbconn.Source, schema string) {
	t.Helper()
	db := dbs.New(t, version)
	return db.Source, db.Schema
}

func queryRow[T any](t *testing.T, src *dbconn.Source, sql string, args ...any) T {
	t.Helper()
	conn, err := src.Connect(context.Background())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var v T
	require.NoError(t, conn.QueryRow(context.Background(), sql, args...).Scan(&v))
	return v
}

func TestSeedCreatesRunningInstances(t *testing.T) {
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{Common: simconfig.Common{Schema: schema}, Instances: 3, HistoryEvents: 40, EventBytes: 250}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	require.Equal(t, []string{"organic-0000", "organic-0001", "organic-0002"}, info.Instances)
	require.Equal(t, []string{"m-0-0", "m-0-1", "m-0-2"}, info.Messages)

	require.Equal(t, int64(120), queryRow[int64](t, src, "SELECT count(*) FROM "+schema+".history"))
	require.Equal(t, int64(3), queryRow[int64](t, src, "SELECT count(*) FROM "+schema+".executions WHERE status = 'Running' AND duroxide_version_minor = 1 AND duroxide_version_patch = 29"))
	avg := queryRow[float64](t, src, "SELECT avg(length(event_data))::float8 FROM "+schema+".history WHERE event_id BETWEEN 1 AND 39")
	require.InDelta(t, 250, avg, 5)
	var first map[string]any
	require.NoError(t, json.Unmarshal([]byte(queryRow[string](t, src, "SELECT event_data FROM "+schema+".history WHERE instance_id = 'organic-0001' AND event_id = 1")), &first))
	require.Equal(t, "OrchestrationStarted", first["type"])
	require.Equal(t, "0.1.29", first["duroxide_version"])
	require.Equal(t, "organic-0001", first["instance_id"])
	last := queryRow[string](t, src, "SELECT event_data FROM "+schema+".history WHERE instance_id = 'organic-0001' AND event_id = 40")
	// duroxide's field order: the common fields, then type and the variant's.
	require.Regexp(t, `^\{"event_id":40,"source_event_id":null,"instance_id":"organic-0001","execution_id":1,"timestamp_ms":\d+,"duroxide_version":"0.1.29","type":"ExternalSubscribed","name":"tick"\}$`, last)

	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	require.ElementsMatch(t, info.Messages, pending)

	// Seeding again starts over.
	_, err = dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	require.Equal(t, int64(3), queryRow[int64](t, src, "SELECT count(*) FROM "+schema+".orchestrator_queue"))
}

func TestNormalTurnsKeepInstancesHotAndConserveMessages(t *testing.T) {
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 5 * time.Second, Duration: 1500 * time.Millisecond},
		Dispatchers: 3, Instances: 4, HistoryEvents: 20}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	ev := log.Events()
	s := dispatch.Summarize(ev, log.Elapsed(), 10)
	require.Greater(t, s.CompletedTurns, 20, "%+v", s)
	require.Zero(t, s.DeadOnArrival)
	require.Zero(t, s.InvalidLockAcks)
	require.Zero(t, s.OtherErrors, s.FirstError)
	require.Equal(t, 1, s.MaxAttemptCount)
	require.Greater(t, s.RemainingP1Ms, int64(4000))
	leases := map[string]int64{}
	for _, e := range ev {
		if e.HasRow() {
			require.Equal(t, int64(5000)-e.RemainingMs, e.LeaseAgeMs)
			require.LessOrEqual(t, e.LeaseAgeMs, e.CallerAfterMs-e.CallerBeforeMs+1, "at 20 the lease starts at the end of the call")
			leases[e.Token] = e.LockedUntilMs
		}
		if e.Kind == dispatch.KindAck {
			// The ack's round trip read the clock and its lease first.
			require.Equal(t, leases[e.Token], e.AckLockedUntilMs, "%+v", e)
			require.Greater(t, e.AckDBStartMs, int64(0))
			require.Less(t, e.AckDBStartMs, e.AckLockedUntilMs)
		}
	}

	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	require.Len(t, pending, 4, "one message per instance stays queued")
	require.NoError(t, dispatch.Conservation(info.Messages, ev, pending))

	// Each turn appended ExternalEvent + ExternalSubscribed with the next ids.
	var acked dispatch.Event
	for _, e := range ev {
		if e.Kind == dispatch.KindAck && e.Outcome == dispatch.OutcomeOK {
			acked = e
			break
		}
	}
	require.NotEmpty(t, acked.Messages)
	data := queryRow[string](t, src, "SELECT event_data FROM "+schema+".history WHERE instance_id = $1 AND event_id = 21", acked.Instance)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(data), &got))
	require.Equal(t, "ExternalEvent", got["type"])
	require.Equal(t, "tick", got["name"])
	require.Equal(t, acked.Messages[0], got["data"])
	require.Equal(t, acked.Instance, got["instance_id"])
	require.Equal(t, int64(0), queryRow[int64](t, src, "SELECT count(*) FROM "+schema+".executions WHERE status <> 'Running'"))
}

func TestPoisonAckFailsTheOrchestrationLikeTheRuntime(t *testing.T) {
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 5 * time.Second, Duration: 500 * time.Millisecond},
		Dispatchers: 1, Instances: 1, HistoryEvents: 10}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	conn, err := src.Connect(context.Background())
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), "UPDATE "+schema+".orchestrator_queue SET attempt_count = 10")
	require.NoError(t, err)
	conn.Close(context.Background())

	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	s := dispatch.Summarize(log.Events(), log.Elapsed(), 10)
	require.Equal(t, 1, s.PoisonAcks)
	require.Equal(t, 1, s.PoisonAcksOK)
	require.Equal(t, 11, s.MaxAttemptCount)
	require.Zero(t, s.CompletedTurns)

	require.Equal(t, "Failed", queryRow[string](t, src, "SELECT status FROM "+schema+".executions"))
	require.Equal(t, "poison: orchestration organic-0000 exceeded 11 attempts (max 10)",
		queryRow[string](t, src, "SELECT output FROM "+schema+".executions"))
	var failed struct {
		EventID     int64  `json:"event_id"`
		InstanceID  string `json:"instance_id"`
		ExecutionID int64  `json:"execution_id"`
		Type        string `json:"type"`
		Details     struct {
			Poison struct {
				AttemptCount int    `json:"attempt_count"`
				MaxAttempts  int    `json:"max_attempts"`
				Message      string `json:"message"`
				MessageType  struct {
					Orchestration struct {
						Instance    string `json:"instance"`
						ExecutionID int64  `json:"execution_id"`
					} `json:"Orchestration"`
				} `json:"message_type"`
			} `json:"Poison"`
		} `json:"details"`
	}
	require.NoError(t, json.Unmarshal([]byte(queryRow[string](t, src, "SELECT event_data FROM "+schema+".history WHERE event_id = 11")), &failed))
	require.Equal(t, "OrchestrationFailed", failed.Type)
	require.Equal(t, "", failed.InstanceID) // the runtime's placeholders
	require.Equal(t, int64(0), failed.ExecutionID)
	require.Equal(t, 11, failed.Details.Poison.AttemptCount)
	require.Equal(t, 10, failed.Details.Poison.MaxAttempts)
	require.Equal(t, "organic-0000", failed.Details.Poison.MessageType.Orchestration.Instance)
	require.Contains(t, failed.Details.Poison.Message, `"data": "m-0-0"`)

	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	require.Empty(t, pending)
	require.NoError(t, dispatch.Conservation(info.Messages, log.Events(), pending))
}

func TestAnExpiredLeaseIsFailedOnceAndNeverAbandoned(t *testing.T) {
	// Both protocols: the ack's clock read shares its round trip either way.
	for _, mode := range []string{"", "simple_protocol"} {
		t.Run("exec mode "+mode, func(t *testing.T) { expiredLeaseIsFailedOnce(t, mode) })
	}
}

func expiredLeaseIsFailedOnce(t *testing.T, execMode string) {
	// A 100 ms lease and a 300 ms turn: the lease is gone at ack time (the
	// renewal would come after 1 s, and would extend by 0 s anyway).
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 100 * time.Millisecond, Duration: 1500 * time.Millisecond},
		Dispatchers: 1, Instances: 1, HistoryEvents: 10, TurnTime: 300 * time.Millisecond}
	if execMode != "" {
		dsn := src.DSN()
		switch {
		case strings.Contains(dsn, "://") && strings.Contains(dsn, "?"):
			dsn += "&default_query_exec_mode=" + execMode
		case strings.Contains(dsn, "://"):
			dsn += "?default_query_exec_mode=" + execMode
		default:
			dsn += " default_query_exec_mode=" + execMode
		}
		cfg.Via = testdb.MustSource(t, dsn)
		require.Equal(t, pgx.QueryExecModeSimpleProtocol, cfg.Via.Config().DefaultQueryExecMode)
	}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	ev := log.Events()
	var kinds []dispatch.Kind
	for _, e := range ev {
		if e.Kind != dispatch.KindFetch {
			kinds = append(kinds, e.Kind)
			require.Equal(t, dispatch.OutcomeInvalidLockToken, e.Outcome, "%+v", e)
		}
	}
	require.GreaterOrEqual(t, len(kinds), 4)
	require.Zero(t, len(kinds)%2)
	for i := 0; i+1 < len(kinds); i += 2 {
		require.Equal(t, []dispatch.Kind{dispatch.KindAck, dispatch.KindFailAck}, kinds[i:i+2])
	}
	s := dispatch.Summarize(ev, log.Elapsed(), 10)
	require.Equal(t, s.Fetches, s.InvalidLockAcks)
	require.Zero(t, s.Abandons)
	require.Zero(t, s.Renewals)
	require.Equal(t, s.Fetches, s.MaxAttemptCount, "every fetch re-claims the same message")
	// Every refusal came after the lease ran out, in the 300 ms turn: about
	// 200 ms late.
	require.Zero(t, s.RefusedWhileValidAcks)
	require.Equal(t, s.InvalidLockAcks, s.RefusedLateAcks)
	require.Equal(t, s.InvalidLockAcks, s.LateInProcessing)
	require.Equal(t, s.InvalidLockAcks, s.LatenessSamples)
	require.GreaterOrEqual(t, s.LatenessMinMs, int64(150))
	require.GreaterOrEqual(t, s.LateProcessingP50Ms, int64(250))

	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	require.NoError(t, dispatch.Conservation(info.Messages, ev, pending))
	require.Equal(t, "Running", queryRow[string](t, src, "SELECT status FROM "+schema+".executions"))
}

func TestRenewalKeepsALongTurnAlive(t *testing.T) {
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 2 * time.Second, Duration: 2 * time.Second},
		Dispatchers: 2, Instances: 1, HistoryEvents: 10, TurnTime: 2500 * time.Millisecond}
	_, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	s := dispatch.Summarize(log.Events(), log.Elapsed(), 10)
	require.Equal(t, 1, s.Fetches, "the other dispatcher never gets the instance")
	require.Equal(t, 2, s.Renewals)
	require.Zero(t, s.RenewalsFailed)
	require.Equal(t, 1, s.CompletedTurns, "the turn ran past the timeout, within the shutdown grace, and acked")
}

func TestRunStopsCleanlyOnCancel(t *testing.T) {
	src, schema := newDB(t, 20)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: time.Second, Duration: time.Minute},
		Dispatchers: 6, Instances: 2, HistoryEvents: 10}
	_, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	log := dispatch.NewLog()
	go func() { done <- dispatch.RunLog(ctx, src, cfg, log) }()
	require.Eventually(t, func() bool { return log.Len() > 50 }, 10*time.Second, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
	if !assertEventually(func() bool { return runtime.NumGoroutine() <= before }, 2*time.Second) {
		buf := make([]byte, 1<<16)
		t.Fatalf("goroutines: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
	db := queryRow[string](t, src, "SELECT current_database()")
	require.Eventually(t, func() bool {
		return queryRow[int64](t, src, "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", db) == 0
	}, 2*time.Second, 20*time.Millisecond, "connections left open")
}

func TestVersion19LeaseDeadOnArrivalWhenTheFetchOutlastsTheTimeout(t *testing.T) {
	// One dispatcher, no contention: a 1.25 MB history takes longer to
	// fetch than a 10 ms lease lasts. At 19 the lease is counted from the
	// caller's clock before the call, so it arrives dead; the runtime's acks
	// fail and attempt_count climbs past max_attempts.
	src, schema := newDB(t, 19)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 10 * time.Millisecond, Duration: 2 * time.Second},
		Dispatchers: 1, Instances: 1, HistoryEvents: 5000}
	_, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	s := dispatch.Summarize(log.Events(), log.Elapsed(), 10)
	require.Greater(t, s.Fetches, 0)
	require.Equal(t, s.Fetches, s.DeadOnArrival, "%+v", s)
	require.Equal(t, s.Fetches, s.InvalidLockAcks)
	require.Zero(t, s.CompletedTurns)
	require.Equal(t, s.Fetches, s.MaxAttemptCount, "every fetch re-claims the same message")
	for _, e := range log.Events() {
		if e.HasRow() && !e.LeaseLost {
			require.Equal(t, e.CallerAfterMs-e.CallerBeforeMs, e.LeaseAgeMs, "at 19 the lease starts at p_now_ms: %+v", e)
		}
	}
}

func assertEventually(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return cond()
}

// The hooks see every call with its backend, and a crash after a fetch
// drops that lease: no ack carries its token, the dispatcher connects
// again, and the instance is taken up again once the lease expired.
func TestHooksSeeEveryCallAndACrashDropsTheLease(t *testing.T) {
	src, schema := newDB(t, 20)
	var mu sync.Mutex
	kinds := map[dispatch.Kind]int{}
	connects, crashes := 0, 0
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 300 * time.Millisecond, PollInterval: 10 * time.Millisecond, Duration: 1500 * time.Millisecond},
		Dispatchers: 1, Instances: 1, HistoryEvents: 10,
		Hooks: dispatch.Hooks{
			Connect: func(ctx context.Context, _ int, c *pgx.ConnConfig) (*pgx.Conn, error) {
				mu.Lock()
				connects++
				mu.Unlock()
				return pgx.ConnectConfig(ctx, c)
			},
			Call: func(_ int, kind dispatch.Kind, pid uint32) func(error, bool) {
				mu.Lock()
				defer mu.Unlock()
				if pid != 0 {
					kinds[kind]++
				}
				return nil
			},
			Crash: func(int) (time.Duration, bool) {
				mu.Lock()
				defer mu.Unlock()
				crashes++
				return 10 * time.Millisecond, crashes == 1
			},
		}}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	ev := log.Events()

	var crashed dispatch.Event
	for _, e := range ev {
		if e.Detail == dispatch.DetailCrashed {
			crashed = e
			break
		}
	}
	require.True(t, crashed.HasRow(), "the first fetch crashed its dispatcher")
	for _, e := range ev {
		require.False(t, e.Kind != dispatch.KindFetch && e.Token == crashed.Token, "the crashed lease was used by %s", e.Kind)
	}
	require.Equal(t, 2, connects, "connected at the start and again after the crash")
	// Each kind counted only calls made on a known backend.
	require.Positive(t, kinds[dispatch.KindFetch])
	require.Positive(t, kinds[dispatch.KindLeaseRead])
	require.Positive(t, kinds[dispatch.KindAck])
	s := dispatch.Summarize(ev, log.Elapsed(), 10)
	require.Positive(t, s.CompletedTurns, "the instance advanced after the lease expired")
	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	require.NoError(t, dispatch.Conservation(info.Messages, ev, pending))
}

// An ack whose connection is lost is recorded with an unknown outcome and
// retried on a new connection, where it commits.
func TestALostConnectionIsReplacedAndTheAckRetried(t *testing.T) {
	src, schema := newDB(t, 20)
	admin, err := src.Connect(context.Background())
	require.NoError(t, err)
	defer admin.Close(context.Background())
	killed, killErr := false, error(nil)
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, LockTimeout: 5 * time.Second, Duration: 500 * time.Millisecond},
		Dispatchers: 1, Instances: 1, HistoryEvents: 10,
		Hooks: dispatch.Hooks{Call: func(_ int, kind dispatch.Kind, pid uint32) func(error, bool) {
			if kind == dispatch.KindAck && !killed {
				killed = true
				// Wait (up to 5 s) until the backend is gone.
				var ok bool
				if killErr = admin.QueryRow(context.Background(), "SELECT pg_terminate_backend($1, 5000)", int64(pid)).Scan(&ok); killErr == nil && !ok {
					killErr = errors.New("pg_terminate_backend: no such backend")
				}
			}
			return nil
		}}}
	info, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	log, err := dispatch.Run(context.Background(), src, cfg)
	require.NoError(t, err)
	require.True(t, killed)
	require.NoError(t, killErr)
	var acks []dispatch.Event
	for _, e := range log.Events() {
		if e.Kind == dispatch.KindAck {
			acks = append(acks, e)
		}
	}
	require.GreaterOrEqual(t, len(acks), 2)
	require.True(t, dispatch.IsUnknown(acks[0].Outcome), "the ack on the killed connection: %s", acks[0].Outcome)
	require.Equal(t, acks[0].Token, acks[1].Token, "retried with the same token")
	require.Equal(t, dispatch.OutcomeOK, acks[1].Outcome)
	pending, err := dispatch.PendingMessages(context.Background(), src, schema)
	require.NoError(t, err)
	ev := log.Events()
	require.NoError(t, dispatch.Conservation(info.Messages, ev, pending), "the unknown ack did not commit, the retry did")
}

// What runs alongside the dispatchers is waited for, and its error is
// Run's.
func TestRunWaitsForWhatRunsAlongsideAndReturnsItsError(t *testing.T) {
	src, schema := newDB(t, 20)
	finished := false
	cfg := dispatch.Config{
		Common:      simconfig.Common{Schema: schema, Duration: 200 * time.Millisecond},
		Dispatchers: 1, Instances: 1, HistoryEvents: 10,
		Hooks: dispatch.Hooks{During: func(ctx context.Context) error {
			<-ctx.Done()
			finished = true
			return errors.New("restart failed")
		}}}
	_, err := dispatch.Seed(context.Background(), src, cfg)
	require.NoError(t, err)
	_, err = dispatch.Run(context.Background(), src, cfg)
	require.ErrorContains(t, err, "restart failed")
	require.True(t, finished)
}
