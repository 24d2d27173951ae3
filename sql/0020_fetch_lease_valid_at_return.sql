-- 0020_fetch_lease_valid_at_return.sql
-- Fixes: fetch_orchestration_item
-- Leaves: fetch_orchestration_item as upstream 24, 27
--
-- Not an upstream migration: this pack's fix of fetch_orchestration_item.
-- (Upstream's own version 20, 0020_add_kv_delta.sql, is a different change
-- that duroxide-pg's runner must still apply, so this file records nothing
-- in _duroxide_migrations.)
--
-- What: redefines fetch_orchestration_item with the same signature,
-- defaults and RETURNS TABLE, and the same results and side effects for the
-- same database state when nothing contends (only the lock token and the
-- lease times differ).
--
-- Why: at version 19 the function
--   1. picks the globally oldest candidate and then BLOCKS on
--      pg_advisory_xact_lock(hashtext(instance_id)): every dispatcher queues
--      behind the same key (a convoy);
--   2. computes the lease and every liveness check from p_now_ms, a time the
--      caller minted before the call and never refreshed: when the wait
--      outlasts the lock timeout the lease is dead on arrival, every ack
--      fails with 'Invalid lock token' and attempt_count climbs forever;
--   3. loops without bound (its CONTINUE paths).
--
-- The fix:
--   * Never wait. The instance is taken with pg_try_advisory_xact_lock; on
--     failure the next eligible candidate is tried in the same call (the
--     ones already tried are excluded). Queue rows and the instance_locks
--     row are locked with SKIP LOCKED; a candidate whose rows another
--     session holds is skipped, never waited for. A call whose candidates
--     are all contended returns no row at once.
--   * Bounded. At most 32 candidates are tried per call (enough for a fleet
--     of 32 dispatchers contending on the oldest instances, since an
--     instance being fetched by another session is the only reason a
--     candidate fails), then the call returns no row.
--   * Clock model. Two clocks matter: the caller's (p_now_ms, an epoch-ms
--     time minted by the application host before it sent the statement) and
--     the database's (clock_timestamp()). duroxide-pg moved to caller time
--     in its versions 6 and 12 so that hosts whose clocks differ from the
--     database's agree with their own acks and renewals; a fix that simply
--     switched to the database clock would break a caller whose clock runs
--     ahead. So:
--       - "now" for every liveness and visibility decision is the CALLER's
--         clock carried forward: p_now_ms plus the time elapsed inside the
--         database since the statement started (clock_timestamp() minus
--         statement_timestamp()), re-read after every step that can take
--         time. A lock is never treated as free, nor a timer as due, before
--         the caller's own clock says so.
--       - the lease is computed last, just before the row is returned, as
--         the later of that caller-clock now and the database clock, plus
--         p_lock_timeout_ms, and written to the instance lock and to every
--         claimed message. It is therefore never short by either clock: a
--         stale p_now_ms (caller behind, or a long wait) still gets a full
--         lease by the database clock, and a caller whose clock runs ahead
--         gets a full lease by its own clock, so its ack (which compares
--         against its own p_now_ms) succeeds.
--     Nothing is visible to other sessions until the call's transaction
--     commits, so rewriting the lease at the end is invisible to them.
--   * Bad input is rejected with SQLSTATE 22023 naming the parameter:
--     p_now_ms NULL or negative, p_lock_timeout_ms NULL, <= 0 or above one
--     day. (Version 19 returned no row for a NULL p_now_ms, and handed out
--     leases already expired for a non-positive timeout.) The version filter
--     keeps version 19's semantics exactly: active only when
--     p_min_version_packed is not NULL; min > max or a NULL max then lets
--     only unpinned instances through. Like the pack's 0013..0019, it packs
--     the pinned version in bigint (upstream's integer arithmetic raises
--     22003 for a pinned major of 2148 or more; docs/OPERATIONS.md lists
--     this deviation).
--
-- Which fetch it fixes. Upstream has not changed fetch_orchestration_item
-- since its version 19 (its 20, 21 and 23 leave it alone), so one fixed
-- definition serves every database from 19 on. The migration still first
-- identifies the installed definition by its fingerprint (the md5 of its
-- source, the schema's name replaced by @schema@, as
-- the fingerprint package of the harness computes it): upstream's own text at 19..23,
-- the pack's 0019 text, or this fix (installed again, no change). Anything
-- else (a hand edit, a newer upstream) makes it fail with SQLSTATE 55000
-- naming the function, and the transaction changes nothing. The guard's
-- table is the one home of these fingerprints; harness/ops/fingerprint reads
-- it from this file.
--
-- Upstream's candidate fix of its issue #21 (its branch file
-- 0024_fix_expired_orchestration_lock_lease.sql, unreleased; its own text
-- and the port the pack's tests use), alone or with the amendment this
-- project offers upstream, is known too and left as it is (behaves_as 24
-- or 25): it never waits on a contended instance either, and its key is
-- scoped to the schema, which this fix's is not, so installing this fix
-- over it would undo a change of upstream's. 0029 replaces it with the
-- pack's fix, which takes the same key. The fingerprint replaces the
-- schema's name where it qualifies a table and where it is a string
-- literal (the candidate's key).
--
-- Down identifies the definition the same way and restores version 19's
-- definition (the pack's text, behaviourally identical to upstream's) over
-- the fix or over a 19 definition, leaves upstream's candidate as it is,
-- and refuses an unknown one. Full body, not an edit of the installed
-- text: the restored definition is a known one whatever text was
-- installed before.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $fix$
DECLARE
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_orchestration_item'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint';
    IF NOT FOUND THEN
        RAISE EXCEPTION '0020: schema % has no fetch_orchestration_item(bigint, bigint, bigint, bigint); nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
    FROM (VALUES
        ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
        ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
        ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
        ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
        ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
        ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0020: fetch_orchestration_item in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;
    IF v_behaves_as >= 24 THEN
        -- Upstream's candidate fix (its text or the port), alone or with
        -- the amendment offered upstream: it already never waits on a
        -- contended instance, and its key is scoped to the schema, which
        -- this fix's is not. Left as it is; 0029 replaces it with the
        -- pack's fix, scoped key included.
        RAISE NOTICE '0020: fetch_orchestration_item is %; it takes a schema-scoped key this fix does not: left as it is (0029 installs the pack''s fix over it)', v_definition;
        RETURN;
    END IF;
    RAISE NOTICE '0020: fetch_orchestration_item was %; installing the fix', v_definition;
CREATE OR REPLACE FUNCTION fetch_orchestration_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_min_version_packed bigint DEFAULT NULL,
    p_max_version_packed bigint DEFAULT NULL
)
RETURNS TABLE(
    out_instance_id text,
    out_orchestration_name text,
    out_orchestration_version text,
    out_execution_id bigint,
    out_history jsonb,
    out_messages jsonb,
    out_lock_token text,
    out_attempt_count integer,
    out_kv_snapshot jsonb
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many candidates are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_end bigint;
    v_tried text[] := '{}';
    v_instance_id text;
    v_existing_until bigint;
    v_lock_token text;
    v_messages jsonb;
    v_attempt_count integer;
    v_history jsonb;
    v_name text;
    v_version text;
    v_exec_id bigint;
    v_kv jsonb;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_orchestration_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_orchestration_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);

        -- The oldest eligible message whose instance has not been tried yet:
        -- visible by the caller's clock, no live instance lock, and (filter
        -- mode only) the instance's current execution is unpinned, or pinned
        -- to a packed version inside [min, max] (a NULL bound or a NULL
        -- minor/patch fails the range test, as at version 19).
        SELECT q.instance_id INTO v_instance_id
        FROM orchestrator_queue q
        WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
          AND NOT (q.instance_id = ANY (v_tried))
          AND NOT EXISTS (
              SELECT 1 FROM instance_locks il
              WHERE il.instance_id = q.instance_id AND il.locked_until > v_now_ms)
          AND (p_min_version_packed IS NULL OR NOT EXISTS (
              SELECT 1
              FROM instances i
              JOIN executions e
                ON e.instance_id = i.instance_id AND e.execution_id = i.current_execution_id
              WHERE i.instance_id = q.instance_id
                AND e.duroxide_version_major IS NOT NULL
                AND NOT coalesce(
                    (e.duroxide_version_major::bigint * 1000000 + e.duroxide_version_minor * 1000 + e.duroxide_version_patch)
                        BETWEEN p_min_version_packed AND p_max_version_packed,
                    false)))
        ORDER BY q.visible_at, q.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;
        v_tried := v_tried || v_instance_id;

        -- Another session is fetching this instance: move on, never wait.
        IF NOT pg_try_advisory_xact_lock(hashtext(v_instance_id)) THEN
            CONTINUE;
        END IF;

        -- Re-check under a row lock, skipping rows other sessions hold.
        PERFORM 1
        FROM orchestrator_queue q
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
          AND NOT EXISTS (
              SELECT 1 FROM instance_locks il
              WHERE il.instance_id = q.instance_id AND il.locked_until > v_now_ms)
          AND (p_min_version_packed IS NULL OR NOT EXISTS (
              SELECT 1
              FROM instances i
              JOIN executions e
                ON e.instance_id = i.instance_id AND e.execution_id = i.current_execution_id
              WHERE i.instance_id = q.instance_id
                AND e.duroxide_version_major IS NOT NULL
                AND NOT coalesce(
                    (e.duroxide_version_major::bigint * 1000000 + e.duroxide_version_minor * 1000 + e.duroxide_version_patch)
                        BETWEEN p_min_version_packed AND p_max_version_packed,
                    false)))
        LIMIT 1
        FOR UPDATE OF q SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- Take the instance lease. An existing lock row that another session
        -- holds (an ack, renew or abandon in flight) is skipped, not waited
        -- for; one that is still live by the caller's clock is respected.
        v_lock_token := 'lock_' || gen_random_uuid()::text;
        SELECT il.locked_until INTO v_existing_until
        FROM instance_locks il
        WHERE il.instance_id = v_instance_id
        FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            IF v_existing_until > v_now_ms THEN
                CONTINUE;
            END IF;
            UPDATE instance_locks
               SET lock_token = v_lock_token,
                   locked_until = v_now_ms + p_lock_timeout_ms,
                   locked_at = v_now_ms
             WHERE instance_id = v_instance_id;
        ELSE
            INSERT INTO instance_locks (instance_id, lock_token, locked_until, locked_at)
            VALUES (v_instance_id, v_lock_token, v_now_ms + p_lock_timeout_ms, v_now_ms)
            ON CONFLICT (instance_id) DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;  -- the row exists and another session holds it
            END IF;
        END IF;

        -- Claim every visible message of the instance that carries no live
        -- foreign claim, skipping rows other sessions hold.
        UPDATE orchestrator_queue q
           SET lock_token = v_lock_token,
               locked_until = v_now_ms + p_lock_timeout_ms,
               attempt_count = q.attempt_count + 1
         WHERE q.id IN (
               SELECT c.id
               FROM orchestrator_queue c
               WHERE c.instance_id = v_instance_id
                 AND c.visible_at <= to_timestamp(v_now_ms / 1000.0)
                 AND (c.lock_token IS NULL OR c.locked_until <= v_now_ms)
               FOR UPDATE SKIP LOCKED);

        SELECT coalesce(jsonb_agg(q.work_item::jsonb ORDER BY q.id), '[]'::jsonb),
               coalesce(max(q.attempt_count), 1)
          INTO v_messages, v_attempt_count
        FROM orchestrator_queue q
        WHERE q.lock_token = v_lock_token;

        SELECT i.orchestration_name, coalesce(i.orchestration_version, 'unknown'), i.current_execution_id
          INTO v_name, v_version, v_exec_id
        FROM instances i
        WHERE i.instance_id = v_instance_id;

        IF FOUND THEN
            SELECT coalesce(jsonb_agg(h.event_data::jsonb ORDER BY h.event_id), '[]'::jsonb)
              INTO v_history
            FROM history h
            WHERE h.instance_id = v_instance_id AND h.execution_id = v_exec_id;
        ELSE
            -- No instances row yet: all history of the instance, and the
            -- name, version and execution from the first rule that matches.
            SELECT coalesce(jsonb_agg(h.event_data::jsonb ORDER BY h.execution_id, h.event_id), '[]'::jsonb)
              INTO v_history
            FROM history h
            WHERE h.instance_id = v_instance_id;

            IF jsonb_array_length(v_history) > 0 AND (v_history -> 0) ? 'OrchestrationStarted' THEN
                v_name := v_history -> 0 -> 'OrchestrationStarted' ->> 'name';
                v_version := v_history -> 0 -> 'OrchestrationStarted' ->> 'version';
                v_exec_id := 1;
            ELSIF jsonb_array_length(v_messages) > 0 AND (v_messages -> 0) ? 'StartOrchestration' THEN
                v_name := v_messages -> 0 -> 'StartOrchestration' ->> 'orchestration';
                v_version := coalesce(v_messages -> 0 -> 'StartOrchestration' ->> 'version', 'unknown');
                v_exec_id := coalesce((v_messages -> 0 -> 'StartOrchestration' ->> 'execution_id')::bigint, 1);
            ELSIF jsonb_array_length(v_messages) > 0 AND (v_messages -> 0) ? 'ContinueAsNew' THEN
                v_name := v_messages -> 0 -> 'ContinueAsNew' ->> 'orchestration';
                v_version := coalesce(v_messages -> 0 -> 'ContinueAsNew' ->> 'version', 'unknown');
                v_exec_id := 1;
            ELSE
                v_name := 'Unknown';
                v_version := 'unknown';
                v_exec_id := 1;
            END IF;
        END IF;

        SELECT coalesce(jsonb_object_agg(kv.key,
                   jsonb_build_object('value', kv.value, 'last_updated_at_ms', kv.last_updated_at_ms)), '{}'::jsonb)
          INTO v_kv
        FROM kv_store kv
        WHERE kv.instance_id = v_instance_id;

        -- The lease starts now, after all the work above: the later of the
        -- caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_end := greatest(v_now_ms, v_db_ms) + p_lock_timeout_ms;
        UPDATE instance_locks SET locked_until = v_lease_end
         WHERE instance_id = v_instance_id AND lock_token = v_lock_token;
        UPDATE orchestrator_queue SET locked_until = v_lease_end
         WHERE lock_token = v_lock_token;

        RETURN QUERY SELECT v_instance_id, v_name, v_version, v_exec_id, v_history,
                            v_messages, v_lock_token, v_attempt_count, v_kv;
        RETURN;
    END LOOP;
    -- Every candidate tried was contended: no row, the caller polls again.
END;
$fn$;
END;
$fix$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $undo$
DECLARE
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_orchestration_item'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint';
    IF NOT FOUND THEN
        RAISE EXCEPTION '0020: schema % has no fetch_orchestration_item(bigint, bigint, bigint, bigint); nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
    FROM (VALUES
        ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
        ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
        ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
        ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
        ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
        ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0020: fetch_orchestration_item in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;
    IF v_behaves_as >= 24 THEN
        RAISE NOTICE '0020: fetch_orchestration_item is %, which does not carry this fix: left as it is', v_definition;
        RETURN;
    END IF;
    RAISE NOTICE '0020: fetch_orchestration_item was %; restoring version 19''s definition', v_definition;
    -- Restore version 19's definition, verbatim from 0019_add_kv_last_updated.sql.
CREATE OR REPLACE FUNCTION fetch_orchestration_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_min_version_packed bigint DEFAULT NULL,
    p_max_version_packed bigint DEFAULT NULL
)
RETURNS TABLE(
    out_instance_id text,
    out_orchestration_name text,
    out_orchestration_version text,
    out_execution_id bigint,
    out_history jsonb,
    out_messages jsonb,
    out_lock_token text,
    out_attempt_count integer,
    out_kv_snapshot jsonb
)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_found_instance text;
    v_lock_token text;
    v_locked_until bigint;
    v_rows integer;
    v_messages jsonb;
    v_attempt_count integer;
    v_name text;
    v_version text;
    v_execution_id bigint;
    v_history jsonb;
    v_first_message jsonb;
    v_kv_snapshot jsonb;
BEGIN
    -- Steps 1-5 repeat until a lease is taken. Upstream quirks kept: the
    -- loop has no iteration cap and no back-off, every iteration uses the
    -- same p_now_ms, and advisory locks taken in abandoned iterations stay
    -- held until the transaction ends.
    LOOP
        -- 1. Peek (no row locks): the instance of the oldest visible message
        --    whose instance has no live lease and passes the version filter.
        SELECT q.instance_id INTO v_instance_id
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        ORDER BY q.visible_at, q.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- the only way out without a row
        END IF;

        -- 2. Serialise fetchers of this instance (blocking, until commit).
        PERFORM pg_advisory_xact_lock(hashtext(v_instance_id));

        -- 3. Re-check (same predicate) under a row lock, skipping rows other
        --    transactions hold. Selecting INTO one variable locks only the
        --    first row produced.
        SELECT q.instance_id INTO v_found_instance
        FROM orchestrator_queue q
        LEFT JOIN instances i ON i.instance_id = q.instance_id
        LEFT JOIN executions e
               ON e.instance_id = i.instance_id
              AND e.execution_id = i.current_execution_id
        WHERE q.instance_id = v_instance_id
          AND q.visible_at <= v_now
          AND NOT EXISTS (
              SELECT 1
              FROM instance_locks l
              WHERE l.instance_id = q.instance_id
                AND l.locked_until > p_now_ms
          )
          -- Version filter, active only when p_min_version_packed is given: the
          -- current execution is unpinned (or missing), or its packed version
          -- lies in [min, max]. A NULL minor/patch or a NULL max fails the test.
          AND (p_min_version_packed IS NULL
               OR e.duroxide_version_major IS NULL
               OR e.duroxide_version_major::bigint * 1000000
                  + e.duroxide_version_minor * 1000
                  + e.duroxide_version_patch
                  BETWEEN p_min_version_packed AND p_max_version_packed)
        FOR UPDATE OF q SKIP LOCKED;

        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- 4. Mint the lease.
        v_lock_token := 'lock_' || gen_random_uuid()::text;
        v_locked_until := p_now_ms + p_lock_timeout_ms;

        -- 5. Take the instance lease; an existing lease is taken over only if it
        --    has expired.
        INSERT INTO instance_locks AS l (instance_id, lock_token, locked_until, locked_at)
        VALUES (v_instance_id, v_lock_token, v_locked_until, p_now_ms)
        ON CONFLICT (instance_id) DO UPDATE
        SET lock_token = EXCLUDED.lock_token,
            locked_until = EXCLUDED.locked_until,
            locked_at = EXCLUDED.locked_at
        WHERE l.locked_until <= p_now_ms;

        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
            CONTINUE;
        END IF;

        EXIT;
    END LOOP;

    -- 6. Claim every visible, unleased (or expired) message of the instance.
    UPDATE orchestrator_queue q
    SET lock_token = v_lock_token,
        locked_until = v_locked_until,
        attempt_count = q.attempt_count + 1
    WHERE q.instance_id = v_instance_id
      AND q.visible_at <= v_now
      AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms);

    -- 7. The claimed messages in id order, and their highest attempt count
    --    (1 when nothing was claimed).
    SELECT COALESCE(jsonb_agg(q.work_item::jsonb ORDER BY q.id), '[]'::jsonb),
           COALESCE(MAX(q.attempt_count), 1)
    INTO v_messages, v_attempt_count
    FROM orchestrator_queue q
    WHERE q.lock_token = v_lock_token;

    -- 8. Instance metadata and history.
    SELECT i.orchestration_name, i.orchestration_version, i.current_execution_id
    INTO v_name, v_version, v_execution_id
    FROM instances i
    WHERE i.instance_id = v_instance_id;

    IF FOUND THEN
        -- Known instance: history of the current execution.
        v_version := COALESCE(v_version, 'unknown');

        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id
          AND h.execution_id = v_execution_id;
    ELSE
        -- No instance row yet: all history of the instance, and name, version
        -- and execution from the first history event or the first message.
        SELECT COALESCE(jsonb_agg(h.event_data::jsonb ORDER BY h.execution_id, h.event_id), '[]'::jsonb)
        INTO v_history
        FROM history h
        WHERE h.instance_id = v_instance_id;

        v_first_message := v_messages -> 0;

        IF jsonb_array_length(v_history) > 0 AND (v_history -> 0) ? 'OrchestrationStarted' THEN
            -- Name and version may be NULL here; no 'unknown' default.
            v_name := v_history -> 0 -> 'OrchestrationStarted' ->> 'name';
            v_version := v_history -> 0 -> 'OrchestrationStarted' ->> 'version';
            v_execution_id := 1;
        ELSIF v_first_message ? 'StartOrchestration' THEN
            v_name := v_first_message -> 'StartOrchestration' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'StartOrchestration' ->> 'version', 'unknown');
            v_execution_id := COALESCE((v_first_message -> 'StartOrchestration' ->> 'execution_id')::bigint, 1);
        ELSIF v_first_message ? 'ContinueAsNew' THEN
            v_name := v_first_message -> 'ContinueAsNew' ->> 'orchestration';
            v_version := COALESCE(v_first_message -> 'ContinueAsNew' ->> 'version', 'unknown');
            v_execution_id := 1;
        ELSE
            v_name := 'Unknown';
            v_version := 'unknown';
            v_execution_id := 1;
        END IF;
    END IF;

    -- 9. KV snapshot of the instance (all executions):
    --    key -> {"value": <text>, "last_updated_at_ms": <bigint>}.
    SELECT COALESCE(jsonb_object_agg(k.key, jsonb_build_object('value', k.value,
                                                               'last_updated_at_ms', k.last_updated_at_ms)),
                    '{}'::jsonb)
    INTO v_kv_snapshot
    FROM kv_store k
    WHERE k.instance_id = v_instance_id;

    RETURN QUERY
    SELECT v_instance_id, v_name, v_version, v_execution_id,
           v_history, v_messages, v_lock_token, v_attempt_count, v_kv_snapshot;
END;
$fn$;
END;
$undo$;
-- +goose StatementEnd
