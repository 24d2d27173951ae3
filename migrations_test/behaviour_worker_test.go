package migrations_test

// Behaviour of the worker (activity) queue and sessions at version 19 and
// every later pack version: enqueue, fetch
// with tags and sessions, ack, abandon, lock renewal, session renewal and
// cleanup, queue depths. Where a fix changes a lease by the time the call
// ran, or makes a renewal never shorten one, the claim says so
// (behaviour_leases_test.go).

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEnqueueWorkerWork(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("enqueue stores one item verbatim, visible and created at now, with the identity given", func(t *testing.T) {
			h := fresh(t)
			item := `{"ActivityExecute": {"instance":"order-1","execution_id":1,"id":2,"name":"A","input":"x"}}`
			h.exec(`SELECT duroxide.enqueue_worker_work($1, $2, 'order-1', 1, 2, 's1', 'gpu')`, item, clock0)

			rows := h.workerRows()
			require.Len(t, rows, 1)
			r := rows[0]
			require.Equal(t, item, r.WorkItem)
			require.Equal(t, msTime(clock0), r.VisibleAt.UTC())
			require.Equal(t, msTime(clock0), r.CreatedAt.UTC())
			require.Nil(t, r.Token)
			require.Nil(t, r.LockedUntil)
			require.Zero(t, r.Attempts)
			require.Equal(t, ptrTo("order-1"), r.Instance)
			require.Equal(t, ptrTo(int64(1)), r.ExecutionID)
			require.Equal(t, ptrTo(int64(2)), r.ActivityID)
			require.Equal(t, ptrTo("s1"), r.Session)
			require.Equal(t, ptrTo("gpu"), r.Tag)
			require.Zero(t, h.count("sessions", "true"), "enqueuing a session item creates no session")
		})

		t.Run("a NULL work item or now fails with 23502", func(t *testing.T) {
			h := fresh(t)
			requirePgError(t, h.try(`SELECT duroxide.enqueue_worker_work(NULL, $1)`, clock0), "23502", "")
			requirePgError(t, h.try(`SELECT duroxide.enqueue_worker_work('{}', NULL)`), "23502", "")
			require.Empty(t, h.workerRows())
		})
	})
}

func TestFetchWorkItem(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		t.Run("a default fetch claims the oldest untagged visible item for now+timeout", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"tagged"}`, clock0, nil, "gpu")
			h.enqueueWork(`{"n":"a"}`, clock0, nil, nil)
			h.enqueueWork(`{"n":"b"}`, clock0, nil, nil)

			w := h.fetchDefault(clock0 + 100)
			require.NotNil(t, w)
			require.Equal(t, `{"n":"a"}`, w.WorkItem)
			require.Regexp(t, lockTokenRE, w.Token)
			require.EqualValues(t, 1, w.Attempts)
			r := h.workerRows()[1]
			require.Equal(t, ptrTo(w.Token), r.Token)
			require.NotNil(t, r.LockedUntil)
			requireLeaseFrom(t, h, "fetch_work_item", clock0+100+lockMs, *r.LockedUntil)
			require.EqualValues(t, 1, r.Attempts)
			require.Equal(t, msTime(clock0), r.VisibleAt.UTC(), "visible_at is left alone")
		})

		t.Run("items are taken in id order, not visible_at order", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"first-id"}`, clock0+100, nil, nil)
			h.enqueueWork(`{"n":"visible-earlier"}`, clock0, nil, nil)
			require.Equal(t, `{"n":"first-id"}`, h.fetchDefault(clock0+200).WorkItem)
		})

		t.Run("an item is invisible until its visible_at", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0+1_000, nil, nil)
			require.Nil(t, h.fetchDefault(h.justBefore("fetch_work_item", clock0+1_000)))
			require.NotNil(t, h.fetchDefault(clock0+1_000))
		})

		t.Run("a leased item comes back only when locked_until is reached, with attempt 2", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0, nil, nil)
			first := h.fetchDefault(clock0)
			until := h.workerLease(0)
			requireLeaseFrom(t, h, "fetch_work_item", clock0+lockMs, until)
			require.Nil(t, h.fetchDefault(h.justBefore("fetch_work_item", until)))
			second := h.fetchDefault(until)
			require.NotNil(t, second)
			require.NotEqual(t, first.Token, second.Token)
			require.EqualValues(t, 2, second.Attempts)
		})

		t.Run("a fetcher without an owner never receives a session item", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s"}`, clock0, "s1", nil)
			require.Nil(t, h.fetchDefault(clock0))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, nil, "any"))
			require.NotNil(t, h.fetchWork(clock0, lockMs, "w1", nil, nil, "default_only"))
		})

		// tagged: an untagged item, then gpu, then cpu.
		tagged := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.enqueueWork(`{"n":"untagged"}`, clock0, nil, nil)
			h.enqueueWork(`{"n":"gpu"}`, clock0, nil, "gpu")
			h.enqueueWork(`{"n":"cpu"}`, clock0, nil, "cpu")
			return h
		}
		drain := func(h *schemaDB, tags []string, mode any) []string {
			got := []string{}
			for w := h.fetchWork(clock0, lockMs, nil, nil, tags, mode); w != nil; w = h.fetchWork(clock0, lockMs, nil, nil, tags, mode) {
				got = append(got, w.WorkItem)
			}
			return got
		}

		t.Run("tag mode 'default_only' takes untagged items only", func(t *testing.T) {
			h := tagged(t)
			require.Equal(t, []string{`{"n":"untagged"}`}, drain(h, []string{"gpu"}, "default_only"))
		})

		t.Run("tag mode 'tags' takes items whose tag is listed, case-sensitively", func(t *testing.T) {
			h := tagged(t)
			require.Empty(t, drain(h, []string{"GPU"}, "tags"))
			require.Equal(t, []string{`{"n":"gpu"}`}, drain(h, []string{"gpu", "tpu"}, "tags"))
		})

		t.Run("tag mode 'default_and' takes untagged items and listed tags", func(t *testing.T) {
			h := tagged(t)
			require.Equal(t, []string{`{"n":"untagged"}`, `{"n":"cpu"}`}, drain(h, []string{"cpu"}, "default_and"))
		})

		t.Run("tag mode 'any' takes everything in id order", func(t *testing.T) {
			h := tagged(t)
			require.Equal(t, []string{`{"n":"untagged"}`, `{"n":"gpu"}`, `{"n":"cpu"}`}, drain(h, nil, "any"))
		})

		t.Run("tag mode 'none', an unknown mode, a NULL mode or 'tags' without tags take nothing and write nothing", func(t *testing.T) {
			h := tagged(t)
			require.Nil(t, h.fetchWork(clock0, lockMs, "w1", int64(60_000), []string{"gpu"}, "none"))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, []string{"gpu"}, "bogus"))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, []string{"gpu"}, "DEFAULT_ONLY"))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, []string{"gpu"}, nil))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, nil, "tags"))
			require.Nil(t, h.fetchWork(clock0, lockMs, nil, nil, []string{}, "tags"))
			require.Zero(t, h.count("worker_queue", "lock_token IS NOT NULL OR attempt_count <> 0"))
		})

		t.Run("the default tag mode is 'default_only'", func(t *testing.T) {
			h := tagged(t)
			var item string
			h.scan(`SELECT out_work_item FROM duroxide.fetch_work_item($1, $2)`, []any{clock0, lockMs}, &item)
			require.Equal(t, `{"n":"untagged"}`, item)
			require.Empty(t, h.texts(`SELECT out_work_item FROM duroxide.fetch_work_item($1, $2)`, clock0, lockMs),
				"the tagged items are left")
			require.EqualValues(t, 1, h.count("worker_queue", "lock_token IS NOT NULL"))
		})
	})
}

func TestWorkerSessions(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		const sessionTimeout = int64(60_000)

		// setup: two items of session s1 and one session-less item.
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.enqueueWork(`{"n":"s1-a"}`, clock0, "s1", nil)
			h.enqueueWork(`{"n":"s1-b"}`, clock0, "s1", nil)
			h.enqueueWork(`{"n":"plain"}`, clock0, nil, nil)
			return h
		}

		t.Run("an owner's fetch claims the item and the session for now + session timeout", func(t *testing.T) {
			h := setup(t)
			w := h.fetchWork(clock0+1_000, lockMs, "w1", sessionTimeout, nil, "default_only")
			require.Equal(t, `{"n":"s1-a"}`, w.WorkItem)
			requireSessionFrom(t, h, "fetch_work_item", sessionRow{Worker: "w1", LockedUntil: clock0 + 61_000, LastActivityAt: clock0 + 1_000}, h.session("s1"))
		})

		t.Run("without a session timeout the session lease is the lock timeout", func(t *testing.T) {
			h := setup(t)
			h.fetchWork(clock0, 30_000, "w1", nil, nil, "default_only")
			requireLeaseFrom(t, h, "fetch_work_item", clock0+30_000, h.session("s1").LockedUntil)
		})

		t.Run("items of a session another worker owns are not eligible; the owner gets them", func(t *testing.T) {
			h := setup(t)
			require.Equal(t, `{"n":"s1-a"}`, h.fetchWork(clock0, lockMs, "w1", sessionTimeout, nil, "default_only").WorkItem)

			w := h.fetchWork(clock0+10, lockMs, "w2", sessionTimeout, nil, "default_only")
			require.Equal(t, `{"n":"plain"}`, w.WorkItem, "w2 skips s1-b")
			require.Nil(t, h.fetchWork(clock0+20, lockMs, "w2", sessionTimeout, nil, "default_only"))
			require.Equal(t, "w1", h.session("s1").Worker)

			require.Equal(t, `{"n":"s1-b"}`, h.fetchWork(clock0+30, lockMs, "w1", sessionTimeout, nil, "default_only").WorkItem)
		})

		t.Run("the owner's next claim resets the session lease, even to an earlier time; from the fix of fetch_work_item on never to an earlier one", func(t *testing.T) {
			h := setup(t)
			h.fetchWork(clock0+1_000, lockMs, "w1", sessionTimeout, nil, "default_only")
			first := h.session("s1").LockedUntil
			h.fetchWork(clock0+3_000, 30_000, "w1", nil, nil, "default_only")
			s := h.session("s1")
			if h.hasFix("fetch_work_item") {
				require.Equal(t, "w1", s.Worker)
				require.Equal(t, first, s.LockedUntil, "the later expiry is kept")
				requireStampFrom(t, h, "fetch_work_item", clock0+3_000, s.LastActivityAt)
				return
			}
			require.Equal(t, &sessionRow{Worker: "w1", LockedUntil: clock0 + 33_000, LastActivityAt: clock0 + 3_000}, s)
		})

		t.Run("once the session lease is reached another worker takes the session over", func(t *testing.T) {
			h := setup(t)
			h.fetchWork(clock0, 120_000, "w1", int64(10_000), nil, "default_only") // s1-a stays leased to w1
			lapse := h.session("s1").LockedUntil
			requireLeaseFrom(t, h, "fetch_work_item", clock0+10_000, lapse)
			require.Equal(t, `{"n":"plain"}`, h.fetchWork(h.justBefore("fetch_work_item", lapse), lockMs, "w2", sessionTimeout, nil, "default_only").WorkItem)

			w := h.fetchWork(lapse, lockMs, "w2", sessionTimeout, nil, "default_only")
			require.NotNil(t, w)
			require.Equal(t, `{"n":"s1-b"}`, w.WorkItem)
			requireSessionFrom(t, h, "fetch_work_item", sessionRow{Worker: "w2", LockedUntil: lapse + sessionTimeout, LastActivityAt: lapse}, h.session("s1"))
		})

		t.Run("claiming a session-less item leaves sessions alone", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"plain"}`, clock0, nil, nil)
			require.NotNil(t, h.fetchWork(clock0, lockMs, "w1", sessionTimeout, nil, "default_only"))
			require.Zero(t, h.count("sessions", "true"))
		})

		t.Run("session and tag filters combine", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s1-gpu"}`, clock0, "s1", "gpu")
			require.Nil(t, h.fetchWork(clock0, lockMs, "w1", sessionTimeout, nil, "default_only"))
			require.Zero(t, h.count("sessions", "true"), "no session is claimed when no item is")
			require.NotNil(t, h.fetchWork(clock0, lockMs, "w1", sessionTimeout, []string{"gpu"}, "tags"))
			require.Equal(t, "w1", h.session("s1").Worker)
		})
	})
}

func TestAckWorker(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		completion := activityCompletedItem("order-1", 1, 2)

		setup := func(t *testing.T) (*schemaDB, *workItem) {
			h := fresh(t)
			h.enqueueWork(activityExecuteItem("order-1", 1, 2, nil, nil), clock0, nil, nil)
			return h, h.fetchDefault(clock0)
		}
		ackWorker := func(h *schemaDB, token string, instance, completion, now any) error {
			return h.try(`SELECT duroxide.ack_worker($1, $2, $3, $4)`, token, instance, completion, now)
		}

		t.Run("ack with a completion deletes the item and enqueues the completion for the orchestrator at now", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, ackWorker(h, w.Token, "order-1", completion, clock0+10))
			require.Empty(t, h.workerRows())
			rows := h.orchRows()
			require.Len(t, rows, 1)
			require.Equal(t, "order-1", rows[0].Instance)
			require.Equal(t, completion, rows[0].WorkItem)
			require.Equal(t, msTime(clock0+10), rows[0].VisibleAt.UTC())
			require.Equal(t, msTime(clock0+10), rows[0].CreatedAt.UTC())
			require.Nil(t, rows[0].Token)
			require.Zero(t, rows[0].Attempts)
		})

		t.Run("ack without a completion only deletes the item", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, h.try(`SELECT duroxide.ack_worker($1, NULL, NULL, $2)`, w.Token, clock0+10))
			require.Empty(t, h.workerRows())
			require.Empty(t, h.orchRows())
		})

		t.Run("ack at or after locked_until fails with 'Worker queue item not found or already processed'", func(t *testing.T) {
			h, w := setup(t)
			until := h.workerLease(0)
			requireLeaseFrom(t, h, "fetch_work_item", clock0+lockMs, until)
			requirePgError(t, ackWorker(h, w.Token, "order-1", completion, until), "P0001", "Worker queue item not found or already processed")
			require.Len(t, h.workerRows(), 1)
			require.Empty(t, h.orchRows())
		})

		t.Run("an unknown or already acked token fails with 'Worker queue item not found or already processed'", func(t *testing.T) {
			h, w := setup(t)
			requirePgError(t, ackWorker(h, "lock_nope", "order-1", completion, clock0+1), "P0001", "Worker queue item not found or already processed")
			require.NoError(t, ackWorker(h, w.Token, "order-1", completion, clock0+1))
			requirePgError(t, ackWorker(h, w.Token, "order-1", completion, clock0+2), "P0001", "Worker queue item not found or already processed")
			require.Len(t, h.orchRows(), 1)
		})

		t.Run("with a NULL now an expired lease is still acked", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, ackWorker(h, w.Token, nil, nil, nil))
			require.Empty(t, h.workerRows())
		})

		t.Run("a completion without instance or now fails and keeps the item", func(t *testing.T) {
			h, w := setup(t)
			requirePgError(t, ackWorker(h, w.Token, nil, completion, clock0+1), "P0001", "p_instance_id is required when p_completion_json is provided")
			requirePgError(t, ackWorker(h, w.Token, "order-1", completion, nil), "P0001", "p_now_ms is required when p_completion_json is provided")
			require.Len(t, h.workerRows(), 1)
			require.Empty(t, h.orchRows())
		})

		t.Run("an unknown token is reported before invalid completion arguments", func(t *testing.T) {
			h, _ := setup(t)
			requirePgError(t, ackWorker(h, "lock_nope", nil, completion, clock0+1), "P0001", "Worker queue item not found or already processed")
		})

		t.Run("ack stamps last_activity_at of a live session without touching its lease", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s"}`, clock0, "s1", nil)
			w := h.fetchWork(clock0, lockMs, "w1", int64(60_000), nil, "default_only")
			lease := h.session("s1").LockedUntil
			requireLeaseFrom(t, h, "fetch_work_item", clock0+60_000, lease)
			require.NoError(t, ackWorker(h, w.Token, "order-1", completion, clock0+500))
			require.Equal(t, &sessionRow{Worker: "w1", LockedUntil: lease, LastActivityAt: clock0 + 500}, h.session("s1"))
		})

		t.Run("ack stamps the session even when another worker owns it now", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s-1"}`, clock0, "s1", nil)
			h.enqueueWork(`{"n":"s-2"}`, clock0, "s1", nil)
			w1 := h.fetchWork(clock0, 120_000, "w1", int64(1_000), nil, "default_only")
			lapse := h.session("s1").LockedUntil
			requireLeaseFrom(t, h, "fetch_work_item", clock0+1_000, lapse)
			require.NotNil(t, h.fetchWork(lapse, lockMs, "w2", int64(60_000), nil, "default_only"), "w2 takes the lapsed session over")
			lease := h.session("s1").LockedUntil
			requireLeaseFrom(t, h, "fetch_work_item", lapse+60_000, lease)
			require.NoError(t, ackWorker(h, w1.Token, "order-1", completion, lapse+1_000))
			require.Equal(t, &sessionRow{Worker: "w2", LockedUntil: lease, LastActivityAt: lapse + 1_000}, h.session("s1"))
		})

		t.Run("ack leaves an expired session's last_activity_at alone", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s"}`, clock0, "s1", nil)
			w := h.fetchWork(clock0, 120_000, "w1", int64(1_000), nil, "default_only")
			before := h.session("s1")
			requireSessionFrom(t, h, "fetch_work_item", sessionRow{Worker: "w1", LockedUntil: clock0 + 1_000, LastActivityAt: clock0}, before)
			require.NoError(t, ackWorker(h, w.Token, "order-1", completion, before.LockedUntil+1_000))
			require.Equal(t, before, h.session("s1"))
		})
	})
}

func TestAbandonWorkItem(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		setup := func(t *testing.T) (*schemaDB, *workItem) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0-1_000, nil, nil)
			return h, h.fetchDefault(clock0)
		}
		abandon := func(h *schemaDB, token string, now int64, delay, ignore any) error {
			return h.try(`SELECT duroxide.abandon_work_item($1, $2, $3, $4)`, token, now, delay, ignore)
		}

		t.Run("abandon releases the item and makes it visible at now", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, abandon(h, w.Token, clock0+10, nil, false))
			r := h.workerRows()[0]
			require.Nil(t, r.Token)
			require.Nil(t, r.LockedUntil)
			require.Equal(t, msTime(clock0+10), r.VisibleAt.UTC())
			require.EqualValues(t, 1, r.Attempts)
			again := h.fetchDefault(clock0 + 10)
			require.NotNil(t, again)
			require.EqualValues(t, 2, again.Attempts)
		})

		t.Run("abandon with a delay hides the item until now + delay", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, abandon(h, w.Token, clock0+10, int64(5_000), false))
			require.Nil(t, h.fetchDefault(h.justBefore("fetch_work_item", clock0+5_010)))
			require.NotNil(t, h.fetchDefault(clock0+5_010))
		})

		t.Run("a zero or negative delay makes the item visible at now", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, abandon(h, w.Token, clock0+10, int64(-5_000), false))
			require.Equal(t, msTime(clock0+10), h.workerRows()[0].VisibleAt.UTC())
		})

		t.Run("ignore_attempt gives the attempt back, never below zero; NULL counts as false", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, abandon(h, w.Token, clock0+10, nil, true))
			require.Zero(t, h.workerRows()[0].Attempts)
			w = h.fetchDefault(clock0 + 20)
			require.EqualValues(t, 1, w.Attempts)
			require.NoError(t, abandon(h, w.Token, clock0+20, nil, nil))
			require.EqualValues(t, 1, h.workerRows()[0].Attempts)
			w = h.fetchDefault(clock0 + 20)
			h.exec(`UPDATE duroxide.worker_queue SET attempt_count = 0`)
			require.NoError(t, abandon(h, w.Token, clock0+30, nil, true))
			require.Zero(t, h.workerRows()[0].Attempts)
		})

		t.Run("an unknown or acked token fails with 'Invalid lock token or already acked'", func(t *testing.T) {
			h, w := setup(t)
			requirePgError(t, abandon(h, "lock_nope", clock0+10, nil, false), "P0001", "Invalid lock token or already acked")
			require.NoError(t, h.try(`SELECT duroxide.ack_worker($1, NULL, NULL, $2)`, w.Token, clock0+10))
			requirePgError(t, abandon(h, w.Token, clock0+20, nil, false), "P0001", "Invalid lock token or already acked")
		})

		t.Run("an expired token that nobody took over can still abandon", func(t *testing.T) {
			h, w := setup(t)
			require.NoError(t, abandon(h, w.Token, clock0+lockMs+60_000, nil, false))
			require.Nil(t, h.workerRows()[0].Token)
		})

		t.Run("abandon leaves the session alone", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s"}`, clock0, "s1", nil)
			w := h.fetchWork(clock0, lockMs, "w1", int64(60_000), nil, "default_only")
			before := h.session("s1")
			require.NoError(t, abandon(h, w.Token, clock0+100, nil, false))
			require.Equal(t, before, h.session("s1"))
		})
	})
}

func TestRenewWorkItemLock(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {

		renew := func(h *schemaDB, token string, now, secs int64) error {
			return h.try(`SELECT duroxide.renew_work_item_lock($1, $2, $3)`, token, now, secs)
		}

		t.Run("renew sets locked_until to now + seconds and keeps the item from other fetchers", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0, nil, nil)
			w := h.fetchDefault(clock0)
			require.NoError(t, renew(h, w.Token, clock0+3_000, 10))
			r := h.workerRows()[0]
			require.NotNil(t, r.LockedUntil)
			requireLeaseFrom(t, h, "renew_work_item_lock", clock0+13_000, *r.LockedUntil)
			require.EqualValues(t, 1, r.Attempts)
			require.Equal(t, msTime(clock0), r.VisibleAt.UTC())
			require.Nil(t, h.fetchDefault(clock0+lockMs+1))
		})

		t.Run("a renewal of 0 s makes the item fetchable at once; from the fix of renew_work_item_lock on it leaves the lease", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0, nil, nil)
			w := h.fetchDefault(clock0)
			before := h.workerLease(0)
			require.NoError(t, renew(h, w.Token, clock0+1_000, 0))
			if h.hasFix("renew_work_item_lock") {
				require.Equal(t, before, h.workerLease(0), "a renewal never shortens the lease")
				require.Nil(t, h.fetchDefault(clock0+1_000), "the item is still held")
				return
			}
			require.NotNil(t, h.fetchDefault(clock0+1_000))
		})

		t.Run("renew at or after locked_until fails with 'Lock token invalid, expired, or already acked'", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{}`, clock0, nil, nil)
			w := h.fetchDefault(clock0)
			until := h.workerLease(0)
			requireLeaseFrom(t, h, "fetch_work_item", clock0+lockMs, until)
			requirePgError(t, renew(h, w.Token, until, 10), "P0001", "Lock token invalid, expired, or already acked")
			requirePgError(t, renew(h, "lock_nope", clock0, 10), "P0001", "Lock token invalid, expired, or already acked")
			require.Equal(t, until, h.workerLease(0))
		})

		t.Run("renew stamps a live session's last_activity_at without extending the session", func(t *testing.T) {
			h := fresh(t)
			h.enqueueWork(`{"n":"s"}`, clock0, "s1", nil)
			w := h.fetchWork(clock0, lockMs, "w1", int64(60_000), nil, "default_only")
			lease := h.session("s1").LockedUntil
			requireLeaseFrom(t, h, "fetch_work_item", clock0+60_000, lease)
			require.NoError(t, renew(h, w.Token, clock0+2_000, 5))
			s := h.session("s1")
			require.Equal(t, "w1", s.Worker)
			require.Equal(t, lease, s.LockedUntil, "the session is not extended")
			requireStampFrom(t, h, "renew_work_item_lock", clock0+2_000, s.LastActivityAt)
		})
	})
}

func TestRenewSessionLockAndCleanup(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		const idle = int64(60_000)
		now := clock0 + 1_000

		// setup: w1 owns live s1 (active) and s2 (idle since exactly now-idle),
		// w2 owns live s3, and w1's s4 has expired.
		setup := func(t *testing.T) *schemaDB {
			h := fresh(t)
			h.exec(`INSERT INTO duroxide.sessions (session_id, worker_id, locked_until, last_activity_at) VALUES
			('s1', 'w1', $1, $2), ('s2', 'w1', $1, $3), ('s3', 'w2', $1, $2), ('s4', 'w1', $4, $2)`,
				clock0+10_000, clock0, now-idle, now)
			return h
		}
		renewSessions := func(h *schemaDB, owners any, now, extend int64) int64 {
			var n int64
			h.scan(`SELECT duroxide.renew_session_lock($1, $2, $3, $4)`, []any{owners, now, extend, idle}, &n)
			return n
		}

		t.Run("renew_session_lock extends the live, non-idle sessions of the owners given and counts them", func(t *testing.T) {
			h := setup(t)
			require.EqualValues(t, 1, renewSessions(h, []string{"w1"}, now, 30_000))
			s1 := h.session("s1")
			require.Equal(t, "w1", s1.Worker)
			requireLeaseFrom(t, h, "renew_session_lock", now+30_000, s1.LockedUntil)
			require.Equal(t, clock0, s1.LastActivityAt, "renewing is not activity")
			require.Equal(t, clock0+10_000, h.session("s2").LockedUntil, "idle exactly idle_timeout: not renewed")
			require.Equal(t, clock0+10_000, h.session("s3").LockedUntil)
			require.Equal(t, now, h.session("s4").LockedUntil, "an expired session is never revived")

			require.EqualValues(t, 2, renewSessions(h, []string{"w1", "w2"}, now, 30_000))
		})

		t.Run("renew_session_lock may shorten a lease; from its fix on it never does", func(t *testing.T) {
			h := setup(t)
			require.EqualValues(t, 1, renewSessions(h, []string{"w1"}, now, 1_000))
			if h.hasFix("renew_session_lock") {
				require.Equal(t, clock0+10_000, h.session("s1").LockedUntil, "a renewal never shortens the lease")
				return
			}
			require.Equal(t, now+1_000, h.session("s1").LockedUntil)
		})

		t.Run("renew_session_lock with no owners renews nothing", func(t *testing.T) {
			h := setup(t)
			require.Zero(t, renewSessions(h, []string{}, now, 30_000))
			require.Zero(t, renewSessions(h, nil, now, 30_000))
			require.Equal(t, clock0+10_000, h.session("s1").LockedUntil)
		})

		t.Run("cleanup_orphaned_sessions deletes sessions expired strictly before now that have no queued item", func(t *testing.T) {
			h := fresh(t)
			h.exec(`INSERT INTO duroxide.sessions (session_id, worker_id, locked_until, last_activity_at) VALUES
			('a', 'w1', $1, 0), ('b', 'w1', $2, 0), ('c', 'w1', $3, 0)`, clock0+100, clock0+200, clock0+300)
			h.enqueueWork(`{}`, clock0+100_000, "b", nil) // any state counts, even not yet visible
			cleanup := func(now int64) int64 {
				var n int64
				h.scan(`SELECT duroxide.cleanup_orphaned_sessions($1)`, []any{now}, &n)
				return n
			}
			require.EqualValues(t, 1, cleanup(clock0+200))
			require.Nil(t, h.session("a"))
			require.NotNil(t, h.session("b"))
			require.NotNil(t, h.session("c"))

			require.EqualValues(t, 1, cleanup(clock0+1_000))
			require.Nil(t, h.session("c"))
			require.NotNil(t, h.session("b"), "a session with a queued item survives")
		})
	})
}

func TestGetQueueDepths(t *testing.T) {
	atEveryVersion(t, func(t *testing.T, fresh func(*testing.T) *schemaDB) {
		depths := func(h *schemaDB, now int64) (orch, worker int64) {
			h.scan(`SELECT orchestrator_queue, worker_queue FROM duroxide.get_queue_depths($1)`, []any{now}, &orch, &worker)
			return orch, worker
		}

		t.Run("empty queues give one row of zeros", func(t *testing.T) {
			h := fresh(t)
			orch, worker := depths(h, clock0)
			require.Zero(t, orch)
			require.Zero(t, worker)
		})

		t.Run("it counts visible unleased messages, ignoring instance locks, sessions and tags", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("a", externalItem("a", "1"), clock0)
			h.enqueueOrch("a", externalItem("a", "2"), clock0)
			h.mustFetchOrch(clock0, "a")                         // a's two messages leased until clock0+lockMs
			h.enqueueOrch("a", externalItem("a", "3"), clock0)   // a is locked, but this message is unleased
			h.enqueueOrch("b", externalItem("b", "1"), clock0)   // visible
			h.enqueueOrch("c", externalItem("c", "1"), clock0+9) // not yet visible

			h.enqueueWork(`{"n":"leased"}`, clock0, nil, nil)
			require.NotNil(t, h.fetchDefault(clock0))
			h.enqueueWork(`{"n":"plain"}`, clock0, nil, nil)
			h.enqueueWork(`{"n":"tagged"}`, clock0, nil, "gpu")
			h.enqueueWork(`{"n":"session"}`, clock0, "s1", nil)
			h.enqueueWork(`{"n":"future"}`, clock0+9, nil, nil)

			orch, worker := depths(h, clock0+1)
			require.EqualValues(t, 2, orch)
			require.EqualValues(t, 3, worker)
		})

		t.Run("a lease that ends exactly now counts as available", func(t *testing.T) {
			h := fresh(t)
			h.enqueueOrch("a", externalItem("a", "1"), clock0)
			h.mustFetchOrch(clock0, "a")
			orchUntil := h.instanceLock("a").LockedUntil // its message carries it
			requireLeaseFrom(t, h, "fetch_orchestration_item", clock0+lockMs, orchUntil)
			h.enqueueWork(`{}`, clock0, nil, nil)
			require.NotNil(t, h.fetchDefault(clock0))
			workerUntil := h.workerLease(0)
			requireLeaseFrom(t, h, "fetch_work_item", clock0+lockMs, workerUntil)

			orch, _ := depths(h, orchUntil-1)
			require.Zero(t, orch)
			orch, _ = depths(h, orchUntil)
			require.EqualValues(t, 1, orch)
			_, worker := depths(h, workerUntil-1)
			require.Zero(t, worker)
			_, worker = depths(h, workerUntil)
			require.EqualValues(t, 1, worker)
		})
	})
}
