-- 0029_schema_scoped_instance_keys.sql
-- Fixes: fetch_orchestration_item, orchestrator_queue_head_offer, orchestrator_queue_head_refresh
--
-- Not an upstream migration: this pack's fix of the advisory keys it takes
-- on an instance. Records nothing in _duroxide_migrations.
--
-- What: redefines fetch_orchestration_item and the two queue-head helpers
-- of 0027 with the same signatures and results; the only change is the
-- advisory key each takes on an instance: hashtext of the schema's name, a
-- dot and the instance id (current_schema(), which SET search_path FROM
-- CURRENT pins to the function's own schema), where 0020 and 0027 hash the
-- instance id alone. The fetch's key stays in the one-key space, the
-- heads' in the two-key space, class 2700.
--
-- Why: advisory locks are database-wide. Two duroxide schemas of one
-- database with the same instance ids (two environments, two tenants, a
-- blue-green pair) took the same keys: a fetch in one schema skipped an
-- instance because a fetch or an enqueue in the other held its key, and a
-- queue head's refresh was left early for the same reason. Upstream's
-- candidate fix of its issue #21 (its branch file
-- 0024_fix_expired_orchestration_lock_lease.sql, unreleased) scopes its
-- fetch's key to the schema the same way; this fix takes exactly that key,
-- so the pack's fetch and upstream's candidate exclude each other on one
-- schema, and replacing the candidate with the pack's fix undoes nothing
-- of upstream's.
--
-- Which definitions it replaces. The fetch: upstream's text at 19..23, the
-- pack's 0019 text, 0020's and 0027's fixes, upstream's candidate fix (its
-- own text, and the port of it the pack's tests use), that candidate with
-- the amendment this project offers upstream (upstream/ at the
-- repository's root), or this fix (installed again, no change). The
-- fetch's lease, its bound and its clock are 0027's, so over the
-- candidate it keeps what the candidate does (no wait on a contended
-- instance, a bounded loop, a skipped instance not tried again in the
-- call, the schema-scoped key) and adds what it lacks (a lease valid at
-- return whatever the caller's timestamp, a cost independent of the
-- messages behind leased instances). The heads' helpers: 0027's text, or
-- this fix. Anything else fails with SQLSTATE 55000 naming the function,
-- and nothing is changed. The fingerprint is the md5 of the function's
-- source with the schema's name replaced by @schema@ where it qualifies a
-- table (name, dot) and where it is a string literal (the candidate's
-- key), as harness/ops/fingerprint computes it.
--
-- Locks: EXCLUSIVE on orchestrator_queue from the guard to the commit (it
-- waits for the transactions that write or row-lock the queue, then keeps
-- new ones out while three functions are replaced: milliseconds on an idle
-- queue); no row is read or written.
-- Duration: milliseconds, whatever the queue holds, once the transactions
-- it waits for have ended.
--
-- Down restores 0027's three definitions over any definition the Up
-- knows, and refuses (SQLSTATE 55000, nothing changed) while
-- _duroxide_migrations records upstream's candidate fix or the amended
-- one: going below 0029 would then undo the candidate's schema-scoped key.
--
-- Down locks: EXCLUSIVE on orchestrator_queue from the LOCK TABLE to the
-- commit, as the Up: it waits for the transactions that write or row-lock the
-- queue, then keeps new ones out while three functions are replaced; plain
-- reads go on; no row is read or written.
-- Down duration: milliseconds, whatever the queue holds, once the transactions
-- it waits for have ended.

-- +goose Up
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_orchestration_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint'),
            ('orchestrator_queue_head_offer', 'p_instance_id text, p_visible_at timestamp with time zone, p_id bigint'),
            ('orchestrator_queue_head_refresh', 'p_instance_id text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0029: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 27 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
            ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
            ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
            ('fetch_orchestration_item', '10fbacba6a5c24f72547b794bce6755f', 'pack 0027 fix', 19, true),
            ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
            ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
            ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false),
            ('fetch_orchestration_item', 'a557cbd1c735cca0e0047065fb359111', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_offer', '9cb80919ffdf6069330de6f0c6ceabe7', 'pack 0027', 19, false),
            ('orchestrator_queue_head_offer', 'f69fbcf54821dee749cd677cd5780ecf', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_refresh', '39d0dff9387cd85c779aeef064c65a7b', 'pack 0027', 19, false),
            ('orchestrator_queue_head_refresh', '133574bbb15415b60288aff0632713cb', 'pack 0029 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0029: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0029: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Wait for every transaction that writes or row-locks the queue (enqueuers,
-- fetches, acks: each took the old keys), and keep new ones out until this
-- transaction commits, so that no transaction holds an old key while
-- another takes a new one. Plain reads go on.
LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_head_offer(p_instance_id text, p_visible_at timestamptz, p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(2700, hashtext(current_schema() || '.' || p_instance_id));
    -- A new statement: it sees whatever a refresh that held the key wrote.
    SELECT h.visible_at, h.id INTO v_visible_at, v_id
    FROM orchestrator_queue_heads h
    WHERE h.instance_id = p_instance_id;
    IF FOUND AND (v_visible_at, v_id) <= (p_visible_at, p_id) THEN
        RETURN;  -- the common case: a message behind an existing head
    END IF;
    -- The instance's first message, or one older than its head.
    INSERT INTO orchestrator_queue_heads AS h (instance_id, visible_at, id)
    VALUES (p_instance_id, p_visible_at, p_id)
    ON CONFLICT (instance_id) DO UPDATE
       SET visible_at = EXCLUDED.visible_at, id = EXCLUDED.id
     WHERE (h.visible_at, h.id) > (EXCLUDED.visible_at, EXCLUDED.id);
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_head_refresh(p_instance_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2700, hashtext(current_schema() || '.' || p_instance_id)) THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot: every offer of this instance that
    -- can still commit has committed, and a new one waits for this
    -- transaction.
    SELECT q.visible_at, q.id INTO v_visible_at, v_id
    FROM orchestrator_queue q
    WHERE q.instance_id = p_instance_id
    ORDER BY q.visible_at, q.id
    LIMIT 1;
    IF FOUND THEN
        INSERT INTO orchestrator_queue_heads AS h (instance_id, visible_at, id)
        VALUES (p_instance_id, v_visible_at, v_id)
        ON CONFLICT (instance_id) DO UPDATE
           SET visible_at = EXCLUDED.visible_at, id = EXCLUDED.id
         WHERE (h.visible_at, h.id) IS DISTINCT FROM (EXCLUDED.visible_at, EXCLUDED.id);
    ELSE
        DELETE FROM orchestrator_queue_heads WHERE instance_id = p_instance_id;
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
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
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $guard$
DECLARE
    v_function record;
    v_raw text;
    v_normalized text;
    v_definition text;
BEGIN
    FOR v_function IN
        SELECT f.name, f.arguments
        FROM (VALUES
            ('fetch_orchestration_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_min_version_packed bigint, p_max_version_packed bigint'),
            ('orchestrator_queue_head_offer', 'p_instance_id text, p_visible_at timestamp with time zone, p_id bigint'),
            ('orchestrator_queue_head_refresh', 'p_instance_id text')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0029: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 27 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 19, false),
            ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 19, false),
            ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 19, true),
            ('fetch_orchestration_item', '10fbacba6a5c24f72547b794bce6755f', 'pack 0027 fix', 19, true),
            ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 24, false),
            ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 24, false),
            ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 27, false),
            ('fetch_orchestration_item', 'a557cbd1c735cca0e0047065fb359111', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_offer', '9cb80919ffdf6069330de6f0c6ceabe7', 'pack 0027', 19, false),
            ('orchestrator_queue_head_offer', 'f69fbcf54821dee749cd677cd5780ecf', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_refresh', '39d0dff9387cd85c779aeef064c65a7b', 'pack 0027', 19, false),
            ('orchestrator_queue_head_refresh', '133574bbb15415b60288aff0632713cb', 'pack 0029 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0029: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0029: % was %; restoring 0027''s definition', v_function.name, v_definition;
    END LOOP;

    -- Below 0029 the fetch takes an unscoped key. Where duroxide-pg's
    -- runner installed upstream's candidate fix (or it with the pack's
    -- amendment), whose key is scoped to the schema, that would undo a
    -- change of upstream's: refuse.
    PERFORM 1
    FROM _duroxide_migrations m
    WHERE m.name IN ('0024_fix_expired_orchestration_lock_lease.sql', '0027_bound_orchestration_lease_by_database_clock.sql');
    IF FOUND THEN
        RAISE EXCEPTION '0029: schema % records upstream''s candidate fix in _duroxide_migrations; going below 0029 would replace its schema-scoped advisory key with an unscoped one; nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'The pack''s fix at 0029 keeps everything the candidate does. To return to the candidate itself, delete its row from _duroxide_migrations and let duroxide-pg''s runner apply it again.';
    END IF;
END;
$guard$;
-- +goose StatementEnd

-- Wait for every transaction that writes or row-locks the queue (enqueuers,
-- fetches, acks: each took the old keys), and keep new ones out until this
-- transaction commits, so that no transaction holds an old key while
-- another takes a new one. Plain reads go on.
LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;

-- Restore 0027's definitions, verbatim from 0027_fetch_by_instance_head.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_head_offer(p_instance_id text, p_visible_at timestamptz, p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(2700, hashtext(p_instance_id));
    -- A new statement: it sees whatever a refresh that held the key wrote.
    SELECT h.visible_at, h.id INTO v_visible_at, v_id
    FROM orchestrator_queue_heads h
    WHERE h.instance_id = p_instance_id;
    IF FOUND AND (v_visible_at, v_id) <= (p_visible_at, p_id) THEN
        RETURN;  -- the common case: a message behind an existing head
    END IF;
    -- The instance's first message, or one older than its head.
    INSERT INTO orchestrator_queue_heads AS h (instance_id, visible_at, id)
    VALUES (p_instance_id, p_visible_at, p_id)
    ON CONFLICT (instance_id) DO UPDATE
       SET visible_at = EXCLUDED.visible_at, id = EXCLUDED.id
     WHERE (h.visible_at, h.id) > (EXCLUDED.visible_at, EXCLUDED.id);
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_head_refresh(p_instance_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    IF NOT pg_try_advisory_xact_lock(2700, hashtext(p_instance_id)) THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot: every offer of this instance that
    -- can still commit has committed, and a new one waits for this
    -- transaction.
    SELECT q.visible_at, q.id INTO v_visible_at, v_id
    FROM orchestrator_queue q
    WHERE q.instance_id = p_instance_id
    ORDER BY q.visible_at, q.id
    LIMIT 1;
    IF FOUND THEN
        INSERT INTO orchestrator_queue_heads AS h (instance_id, visible_at, id)
        VALUES (p_instance_id, v_visible_at, v_id)
        ON CONFLICT (instance_id) DO UPDATE
           SET visible_at = EXCLUDED.visible_at, id = EXCLUDED.id
         WHERE (h.visible_at, h.id) IS DISTINCT FROM (EXCLUDED.visible_at, EXCLUDED.id);
    ELSE
        DELETE FROM orchestrator_queue_heads WHERE instance_id = p_instance_id;
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
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
-- +goose StatementEnd
