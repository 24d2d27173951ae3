-- 0034_fetch_lease_bounded_by_the_database_clock.sql
-- Fixes: fetch_orchestration_item
-- Lease bound: 30000 ms
--
-- Not an upstream migration: this pack's fix of how far the database clock
-- may lengthen an orchestration lease. Records nothing in
-- _duroxide_migrations.
--
-- What: redefines fetch_orchestration_item with 0029's signature,
-- defaults, RETURNS TABLE and body; only the lease's start changes. It
-- runs from the caller's clock carried forward (v_now_ms: p_now_ms plus
-- the time spent in the call), and the database clock (v_db_ms) may move
-- it later by at most a bound, c_lease_bound_ms (30000 ms, the "Lease
-- bound" line above, which harness/ops/doctor reads):
--
--     lease_start = v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms)
--     lease_end   = lease_start + p_lock_timeout_ms
--
-- Why: 0020 to 0029 start the lease at greatest(v_now_ms, v_db_ms), which
-- keeps it valid at return whatever the caller's timestamp (a stale one, a
-- wait for a pooled connection before the call), but lets the database
-- clock lengthen it without limit (a maintainer's review of issue 50): a
-- database clock S ahead of the dispatchers lengthens every lease by S, and
-- the instance of a dispatcher that crashed holding it stays locked S
-- longer than its timeout, by the dispatchers' own clocks, however large S
-- is. With the bound, a crashed holder's instance is taken over at most
-- bound + timeout after its claim, by the caller's clock, whatever the
-- database clock says.
--
-- The bound, 30000 ms, from what was measured and configured:
--   * the staleness the database clock is there to make up for is the time
--     a caller's timestamp spends before the call reaches the function:
--     duroxide-pg mints p_now_ms, then waits for a connection of its sqlx
--     pool, whose acquire timeout is 30 s (DUROXIDE_PG_POOL_MAX
--     connections); a fetch that waits longer fails and never runs. The
--     pool-wait repro measured waits of 6.5-7 s (docs/REPRO.md), and the
--     seed's reproduction A is 10 s stale: both within the bound, so both
--     still get a full lease by the database clock (+4995 ms of 5000 at
--     return);
--   * harness doctor's clock-skew check is critical at the same bound (it
--     reads it from this line): a database clock that far from the
--     callers' is a finding, not something a lease should absorb.
--
-- The trade: a caller whose timestamp is more than the bound behind the
-- database clock (a clock behind by more than 30 s, or a statement queued
-- longer, e.g. in PgBouncer) gets a lease from its own clock plus the
-- bound: by the database clock it has bound + timeout - staleness left at
-- return, none once the staleness exceeds bound + timeout (as upstream's
-- lease from the caller's clock alone has none past the timeout), and its
-- ack is then refused. By its own clock the lease is full. doctor says why: its skew finding is
-- critical from the bound on, and its expired-lease finding lists leases
-- held past their end by the database clock. Below the bound nothing
-- changes from 0029. A caller ahead of the database clock gets its lease
-- from its own clock, as at 0029.
--
-- The same rule, the same bound: 0035 for the worker fetches, 0036 for the
-- renewals. Everything else of 0029's body is unchanged: the candidate
-- from the queue heads (0027), the schema-scoped try-lock key (0029), no
-- wait, at most 32 candidates, visibility and liveness on the caller's
-- clock carried forward, bad input rejected with SQLSTATE 22023.
--
-- Which definitions it replaces: the ones 0029 knows (upstream's text at
-- 19..23, the pack's 0019 text, 0020's, 0027's and 0029's fixes, upstream's
-- candidate fix of its issue #21, its own text and the port the pack's
-- tests use, and that candidate with the amendment this project offers
-- upstream), or this fix (installed again, no change); over each it
-- installs this fix, which keeps what the candidate does (as 0029's). Anything
-- else fails with SQLSTATE 55000 naming the function, and nothing is
-- changed. Over every definition a goose run can meet here (0029's fix, or
-- what duroxide-pg's runner installs over it: the candidate, amended or
-- not) the advisory key is the one this fix takes, so no table lock is
-- needed to keep old and new keys apart (0029 took one for that).
--
-- Locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one); no row is read
-- or written.
-- Duration: milliseconds, whatever the tables hold.
--
-- Down identifies the definition the same way. Over this fix it restores
-- 0029's (the unbounded lease); any other definition it knows is left as
-- it is (it does not carry this fix: replacing it would undo a change of
-- upstream's, or install what is there); an unknown one is refused.
--
-- Down locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $fix$
DECLARE
    v_function record;
    v_count bigint;
    v_raw text;
    v_normalized text;
    v_definition text;
BEGIN
    -- Every function identified before anything changes.
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_orchestration_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint')
        ) AS f(name, arguments)
    LOOP
        SELECT count(*) INTO v_count
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name;

        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND OR v_count > 1 THEN
            RAISE EXCEPTION '0034: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 33 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
            ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
            ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
            ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
            ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
            ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false),
            ('fetch_orchestration_item', '10fbacba6a5c24f72547b794bce6755f', 'pack 0027 fix', 19, true),
            ('fetch_orchestration_item', 'a557cbd1c735cca0e0047065fb359111', 'pack 0029 fix', 19, true),
            ('fetch_orchestration_item', '8685a2a63d0758820997aaab19a137a9', 'pack 0034 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0034: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0034: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;

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
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;

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

        -- The eligible instance with the oldest queue head that has not
        -- been tried yet: its head visible by the caller's clock, no live
        -- instance lock, and (filter mode only) its current execution
        -- unpinned or pinned to a packed version inside [min, max] (a NULL
        -- bound or a NULL minor/patch fails the range test, as at version
        -- 19). One head row per instance: an instance with a live lease
        -- costs one skipped row however many messages wait behind it. Both
        -- instance tests are correlated scalar subqueries, so the plan is
        -- one ordered scan of idx_orch_heads_order under the LIMIT with the
        -- tests as filters, never a hash over a whole table.
        SELECT h.instance_id INTO v_instance_id
        FROM orchestrator_queue_heads h
        WHERE h.visible_at <= to_timestamp(v_now_ms / 1000.0)
          AND NOT (h.instance_id = ANY (v_tried))
          AND NOT coalesce((
              SELECT il.locked_until > v_now_ms
              FROM instance_locks il
              WHERE il.instance_id = h.instance_id), false)
          AND (p_min_version_packed IS NULL OR coalesce((
              SELECT e.duroxide_version_major IS NULL
                     OR coalesce(
                         (e.duroxide_version_major::bigint * 1000000 + e.duroxide_version_minor * 1000 + e.duroxide_version_patch)
                             BETWEEN p_min_version_packed AND p_max_version_packed,
                         false)
              FROM instances i
              JOIN executions e
                ON e.instance_id = i.instance_id AND e.execution_id = i.current_execution_id
              WHERE i.instance_id = h.instance_id), true))
        ORDER BY h.visible_at, h.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;
        v_tried := v_tried || v_instance_id;

        -- Another session is fetching this instance: move on, never wait.
        -- The key is scoped to the schema (its name, a dot, the instance
        -- id: upstream's candidate fix takes the same key).
        IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || '.' || v_instance_id)) THEN
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
            -- Nothing claimable behind this head (it may be early: see the
            -- header): bring it up to date, never waiting, and move on.
            PERFORM orchestrator_queue_head_refresh(v_instance_id);
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

        -- The lease starts now, after all the work above: at the caller's
        -- clock, or at the database's when that is later, by at most
        -- c_lease_bound_ms; plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_end := v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms) + p_lock_timeout_ms;
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
    v_function record;
    v_count bigint;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_restore text[] := '{}';
BEGIN
    -- Every function identified before anything changes.
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_orchestration_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint')
        ) AS f(name, arguments)
    LOOP
        SELECT count(*) INTO v_count
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name;

        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND OR v_count > 1 THEN
            RAISE EXCEPTION '0034: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 33 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
            ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
            ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
            ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
            ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
            ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false),
            ('fetch_orchestration_item', '10fbacba6a5c24f72547b794bce6755f', 'pack 0027 fix', 19, true),
            ('fetch_orchestration_item', 'a557cbd1c735cca0e0047065fb359111', 'pack 0029 fix', 19, true),
            ('fetch_orchestration_item', '8685a2a63d0758820997aaab19a137a9', 'pack 0034 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0034: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_definition = 'pack 0034 fix' THEN
            v_restore := v_restore || v_function.name;
        ELSE
            RAISE NOTICE '0034: % is %, which does not carry this fix: left as it is', v_function.name, v_definition;
        END IF;
    END LOOP;

    IF 'fetch_orchestration_item' = ANY (v_restore) THEN
        RAISE NOTICE '0034: fetch_orchestration_item was pack 0034 fix; restoring 0029''s fix';
        -- 0029's fix, verbatim from 0029_schema_scoped_instance_keys.sql.
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

        -- The eligible instance with the oldest queue head that has not
        -- been tried yet: its head visible by the caller's clock, no live
        -- instance lock, and (filter mode only) its current execution
        -- unpinned or pinned to a packed version inside [min, max] (a NULL
        -- bound or a NULL minor/patch fails the range test, as at version
        -- 19). One head row per instance: an instance with a live lease
        -- costs one skipped row however many messages wait behind it. Both
        -- instance tests are correlated scalar subqueries, so the plan is
        -- one ordered scan of idx_orch_heads_order under the LIMIT with the
        -- tests as filters, never a hash over a whole table.
        SELECT h.instance_id INTO v_instance_id
        FROM orchestrator_queue_heads h
        WHERE h.visible_at <= to_timestamp(v_now_ms / 1000.0)
          AND NOT (h.instance_id = ANY (v_tried))
          AND NOT coalesce((
              SELECT il.locked_until > v_now_ms
              FROM instance_locks il
              WHERE il.instance_id = h.instance_id), false)
          AND (p_min_version_packed IS NULL OR coalesce((
              SELECT e.duroxide_version_major IS NULL
                     OR coalesce(
                         (e.duroxide_version_major::bigint * 1000000 + e.duroxide_version_minor * 1000 + e.duroxide_version_patch)
                             BETWEEN p_min_version_packed AND p_max_version_packed,
                         false)
              FROM instances i
              JOIN executions e
                ON e.instance_id = i.instance_id AND e.execution_id = i.current_execution_id
              WHERE i.instance_id = h.instance_id), true))
        ORDER BY h.visible_at, h.id
        LIMIT 1;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;
        v_tried := v_tried || v_instance_id;

        -- Another session is fetching this instance: move on, never wait.
        -- The key is scoped to the schema (its name, a dot, the instance
        -- id: upstream's candidate fix takes the same key).
        IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || '.' || v_instance_id)) THEN
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
            -- Nothing claimable behind this head (it may be early: see the
            -- header): bring it up to date, never waiting, and move on.
            PERFORM orchestrator_queue_head_refresh(v_instance_id);
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
    END IF;
END;
$undo$;
-- +goose StatementEnd
