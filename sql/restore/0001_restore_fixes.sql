-- The pack's restore step at goose version 37: the fixes duroxide-pg's runner
-- replaced, installed again. Generated from sql/ (the fix migrations' guards,
-- bodies and "-- Leaves:" / "-- Behaviour:" lines) by `harness sql restore`;
-- do not edit. `harness migrate up` runs it after goose's migrations; with psql
-- or the stock goose CLI, after the migrations, search_path naming the schema:
--   psql -v ON_ERROR_STOP=1 -c 'SET search_path TO duroxide' -f sql/restore/0001_restore_fixes.sql "$DSN"
--   GOOSE_DRIVER=postgres GOOSE_DBSTRING="$DSN?search_path=duroxide" goose -dir sql/restore -no-versioning up
-- One statement: it identifies every fixed function first and changes nothing
-- when one is unknown (SQLSTATE 55000), then installs each missing fix under the
-- locks of the migration that brought it. A second run finds every fix in force.
-- Functions: fetch_orchestration_item, ack_orchestration_item, fetch_work_item, renew_work_item_lock, renew_session_lock, renew_orchestration_item_lock, orchestrator_queue_head_offer, orchestrator_queue_head_refresh, orchestrator_queue_heads_after_delete, fetch_work_items (when upstream added it).

-- +goose Up
-- +goose StatementBegin
DO $restore$
DECLARE
    v_fn record;
    v_count bigint;
    v_raw text;
    v_normalized text;
    v_row record;
    v_unknown text[] := '{}';
    v_plan jsonb := '{}';
BEGIN
    -- Every function the pack fixes, identified before anything changes.
    FOR v_fn IN
        SELECT f.name, f.optional
        FROM (VALUES
            ('fetch_orchestration_item', false),
            ('ack_orchestration_item', false),
            ('fetch_work_item', false),
            ('renew_work_item_lock', false),
            ('renew_session_lock', false),
            ('renew_orchestration_item_lock', false),
            ('orchestrator_queue_head_offer', false),
            ('orchestrator_queue_head_refresh', false),
            ('orchestrator_queue_heads_after_delete', false),
            ('fetch_work_items', true)
        ) AS f(name, optional)
    LOOP
        SELECT count(*), min(md5(p.prosrc)),
               min(md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@''')))
          INTO v_count, v_raw, v_normalized
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = current_schema()
           AND p.proname = v_fn.name;
        IF v_count = 0 AND v_fn.optional THEN
            CONTINUE;  -- added by an upstream migration this schema has not had
        ELSIF v_count <> 1 THEN
            v_unknown := v_unknown || format('%s: %s definitions', v_fn.name, v_count);
            CONTINUE;
        END IF;

        -- (function, fingerprint, definition, action)
        SELECT k.definition, k.action INTO v_row
        FROM (VALUES
            ('fetch_orchestration_item', '47b1420f427a8c6faea3d15593c06e41', 'upstream 19-23', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '899345d84cfc6d76afbfa8601405c873', 'pack 0019', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '40c5d3467a5676a1ec38502e190ae645', 'pack 0020 fix', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '378d41386c1abb6a0489168b0a090513', 'upstream candidate 0024, unreleased', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '089829876150568f75c7c7e649e0d1b4', 'upstream candidate 0024, port', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', 'a08aa4f6aa45f2badac50a8fa1f7978b', 'upstream candidate 0024 + amendment 0027', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '10fbacba6a5c24f72547b794bce6755f', 'pack 0027 fix', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', 'a557cbd1c735cca0e0047065fb359111', 'pack 0029 fix', 'install 0034 8685a2a63d0758820997aaab19a137a9'),
            ('fetch_orchestration_item', '8685a2a63d0758820997aaab19a137a9', 'pack 0034 fix', 'in force'),
            ('ack_orchestration_item', '6b8f539683584a7bf3e4243e9eb0786d', 'upstream 19', 'install 0021 9be703b17c70bdc077304f9825055125'),
            ('ack_orchestration_item', 'a7c0bb8c647b78f93b54b6eeeb521ed5', 'pack, as upstream 19', 'install 0021 9be703b17c70bdc077304f9825055125'),
            ('ack_orchestration_item', '9be703b17c70bdc077304f9825055125', 'pack 0021 fix, upstream 19 behaviour', 'in force'),
            ('ack_orchestration_item', 'e09b0488b13cba5e43fbfa4cdf1bac38', 'upstream 20-23', 'install 0021 1590e0fdb3965a379efa3aea63ee71cd'),
            ('ack_orchestration_item', '3b21e6c1421d03f64a4c2de5c443e127', 'pack, as upstream 20', 'install 0021 1590e0fdb3965a379efa3aea63ee71cd'),
            ('ack_orchestration_item', '1590e0fdb3965a379efa3aea63ee71cd', 'pack 0021 fix, upstream 20 behaviour', 'in force'),
            ('ack_orchestration_item', 'abb583bcc970d11b3ecbb85eef1f464a', 'upstream branch 0024 continued-as-new ack, port', 'install 0021 3c40c93291f39a183831b567442fecd2'),
            ('ack_orchestration_item', '6cf0a7cfb3342824aba0d7a701dc4659', 'pack, as upstream 24', 'install 0021 3c40c93291f39a183831b567442fecd2'),
            ('ack_orchestration_item', '3c40c93291f39a183831b567442fecd2', 'pack 0021 fix, upstream 24 behaviour', 'in force'),
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', '3c21f180d28e8c5d9334f34cf9419e04', 'pack 0031 fix', 'install 0035 6aaf60e360e8942b6b740a1382e2207e'),
            ('fetch_work_item', '6aaf60e360e8942b6b740a1382e2207e', 'pack 0035 fix', 'in force'),
            ('renew_work_item_lock', '27842e4207dab97761b627c6adc60eb2', 'upstream 14-23', 'install 0036 1492548829d855cbc0980265cce838ff'),
            ('renew_work_item_lock', 'bc54f4cc7f122821af599e903af36181', 'pack 0014', 'install 0036 1492548829d855cbc0980265cce838ff'),
            ('renew_work_item_lock', '0dcd19d9b355eff3a7768a660a69c500', 'pack 0026 fix', 'install 0036 1492548829d855cbc0980265cce838ff'),
            ('renew_work_item_lock', '1492548829d855cbc0980265cce838ff', 'pack 0036 fix', 'in force'),
            ('renew_session_lock', '994b35482168171df72eb10d74abebc5', 'upstream 14-23', 'install 0036 a8ff1289c6d43cde73eb8eb8e6546ad5'),
            ('renew_session_lock', '87da68ad65c6f445a2e84ed570baaedc', 'pack 0014', 'install 0036 a8ff1289c6d43cde73eb8eb8e6546ad5'),
            ('renew_session_lock', 'd5c0fd415a52aaac2b7d0b407168181a', 'pack 0026 fix', 'install 0036 a8ff1289c6d43cde73eb8eb8e6546ad5'),
            ('renew_session_lock', 'a8ff1289c6d43cde73eb8eb8e6546ad5', 'pack 0036 fix', 'in force'),
            ('renew_orchestration_item_lock', '3acd62b1a71eb9767e745aa5dcbdaac3', 'upstream 2-23', 'install 0036 ed37d76d6c56072838feed4d25ab03a4'),
            ('renew_orchestration_item_lock', '219fa1b144e073a0da0b96b84f176dba', 'pack 0002', 'install 0036 ed37d76d6c56072838feed4d25ab03a4'),
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 'install 0036 ed37d76d6c56072838feed4d25ab03a4'),
            ('renew_orchestration_item_lock', '5cf292d7feecbe4675e1973e117bee76', 'pack 0032 fix', 'install 0036 ed37d76d6c56072838feed4d25ab03a4'),
            ('renew_orchestration_item_lock', 'ed37d76d6c56072838feed4d25ab03a4', 'pack 0036 fix', 'in force'),
            ('orchestrator_queue_head_offer', '9cb80919ffdf6069330de6f0c6ceabe7', 'pack 0027', 'install 0030 fea1358d03c8230beee9491765797530'),
            ('orchestrator_queue_head_offer', 'f69fbcf54821dee749cd677cd5780ecf', 'pack 0029 fix', 'install 0030 fea1358d03c8230beee9491765797530'),
            ('orchestrator_queue_head_offer', 'fea1358d03c8230beee9491765797530', 'pack 0030 fix', 'in force'),
            ('orchestrator_queue_head_refresh', '39d0dff9387cd85c779aeef064c65a7b', 'pack 0027', 'install 0037 6cd2781ed00a3dc44f2d5a0fc285bbd5'),
            ('orchestrator_queue_head_refresh', '133574bbb15415b60288aff0632713cb', 'pack 0029 fix', 'install 0037 6cd2781ed00a3dc44f2d5a0fc285bbd5'),
            ('orchestrator_queue_head_refresh', '3990bdc538349ce8bc5a2792640abd5e', 'pack 0030 fix', 'install 0037 6cd2781ed00a3dc44f2d5a0fc285bbd5'),
            ('orchestrator_queue_head_refresh', '6cd2781ed00a3dc44f2d5a0fc285bbd5', 'pack 0037 fix', 'in force'),
            ('orchestrator_queue_heads_after_delete', '7ef866ec6daf067f23785aa8949801b6', 'pack 0027', 'install 0030 2cb700ddb12dc3edfe73edbb7d130bf8'),
            ('orchestrator_queue_heads_after_delete', '2cb700ddb12dc3edfe73edbb7d130bf8', 'pack 0030 fix', 'in force'),
            ('fetch_work_items', '661169cbe1943d7cefe5f1fdebc64ede', 'upstream branch 0022 batched fetch, unreleased', 'install 0035 fcdb3c264106b44e723aa4208d7a525c'),
            ('fetch_work_items', '28a3539b3f2c9812d8e7dcf1335d7ff3', 'upstream branch 0022 batched fetch, port', 'install 0035 fcdb3c264106b44e723aa4208d7a525c'),
            ('fetch_work_items', '27d36fb5e75593d1b8c4ddbd9ebc67a4', 'upstream batched 0022 + amendment 0028', 'install 0035 fcdb3c264106b44e723aa4208d7a525c'),
            ('fetch_work_items', 'b0ca6b94d0a1c6ece9d1009cb4d42d36', 'pack 0033 Down, as upstream branch 0022', 'install 0035 fcdb3c264106b44e723aa4208d7a525c'),
            ('fetch_work_items', '8e5295d4b64e94cbd74b98c025d46fb3', 'pack 0033 fix', 'install 0035 fcdb3c264106b44e723aa4208d7a525c'),
            ('fetch_work_items', 'fcdb3c264106b44e723aa4208d7a525c', 'pack 0035 fix', 'in force')
        ) AS k(function_name, fingerprint, definition, action)
        WHERE k.function_name = v_fn.name
          AND k.fingerprint IN (v_raw, v_normalized)
        LIMIT 1;
        IF NOT FOUND THEN
            v_unknown := v_unknown || format('%s: a definition nobody knows (fingerprint %s)', v_fn.name, v_normalized);
        ELSE
            v_plan := v_plan || jsonb_build_object(v_fn.name, jsonb_build_object('action', v_row.action, 'definition', v_row.definition));
        END IF;
    END LOOP;
    IF cardinality(v_unknown) > 0 THEN
        RAISE EXCEPTION 'restore: %; nothing was changed', array_to_string(v_unknown, '; ')
            USING ERRCODE = '55000',
                  HINT = 'The pack installs its fixes only over definitions it knows. `harness doctor` shows what is installed; compare it with upstream''s and the pack''s texts.';
    END IF;

    IF v_plan #>> '{fetch_orchestration_item,action}' = 'install 0034 8685a2a63d0758820997aaab19a137a9' THEN
-- The body 0034_fetch_lease_bounded_by_the_database_clock.sql installs (fingerprint 8685a2a63d0758820997aaab19a137a9).
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
        RAISE NOTICE 'restore: fetch_orchestration_item was %; installed the fix of 0034_fetch_lease_bounded_by_the_database_clock.sql', v_plan #>> '{fetch_orchestration_item,definition}';
    END IF;

    IF v_plan #>> '{ack_orchestration_item,action}' = 'install 0021 9be703b17c70bdc077304f9825055125' THEN
-- The body 0021_ack_locks_its_lease.sql installs (fingerprint 9be703b17c70bdc077304f9825055125).
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb,
    p_cancelled_activities jsonb DEFAULT '[]'::jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Every timestamp written comes from the caller's clock.
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_parent_instance_id text;
    v_status text;
    v_output text;
    v_elem jsonb;
    v_activity jsonb;
    v_target_instance text;
    v_fire_at_ms bigint;
    v_visible_at timestamptz;
BEGIN
    -- 1. The lease must exist and still be live. Lock its row until this
    --    ack commits (pack 0021), so that no fetch can take the instance over
    --    between this check and the delete of the batch below.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms
    FOR UPDATE;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- 2. Metadata.
    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id,
                               parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data',
               v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS h(ev, ord)
        ORDER BY h.ord;
    END IF;

    -- 7. Execution status; completed_at only for Completed/Failed, NULL otherwise.
    IF v_status IS NOT NULL THEN
        UPDATE executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_status IN ('Completed', 'Failed') THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7a. Pin the execution to a duroxide version (a JSON null skips this).
    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::integer,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::integer,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::integer
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7b. Custom status: 'set' stores the value, 'clear' nulls it; both bump
    --     the version. Any other action (or none) does nothing.
    IF p_metadata ->> 'custom_status_action' = 'set' THEN
        UPDATE instances i
        SET custom_status = p_metadata ->> 'custom_status_value',
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    ELSIF p_metadata ->> 'custom_status_action' = 'clear' THEN
        UPDATE instances i
        SET custom_status = NULL,
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 7c. KV mutations, in array order (later ones see earlier ones). A JSON
    --     null or a non-array kv_mutations fails with 22023.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                -- A missing last_updated_at_ms is written as an explicit NULL
                -- and fails NOT NULL (23502): the column default 0 does not apply.
                INSERT INTO kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value', p_execution_id,
                        (v_elem ->> 'last_updated_at_ms')::bigint)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    execution_id = EXCLUDED.execution_id,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id
                  AND k.key = v_elem ->> 'key';
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                DELETE FROM kv_store k
                WHERE k.instance_id = v_instance_id;
            END IF;
        END LOOP;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity, session and tag.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id, tag)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
        END LOOP;
    END IF;

    -- 9. Cancel activities, after the worker items were inserted, so that an
    --    activity scheduled and cancelled in the same turn ends up absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord) ORDER BY c.ord
        LOOP
            DELETE FROM worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::bigint
              AND w.activity_id = (v_elem ->> 'activity_id')::bigint;
        END LOOP;
    END IF;

    -- 10. Enqueue orchestrator items, routed by work-item variant.
    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord) ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::bigint;
            ELSIF v_elem ? 'ActivityCompleted' THEN
                v_target_instance := v_elem -> 'ActivityCompleted' ->> 'instance';
            ELSIF v_elem ? 'ActivityFailed' THEN
                v_target_instance := v_elem -> 'ActivityFailed' ->> 'instance';
            ELSIF v_elem ? 'ExternalRaised' THEN
                v_target_instance := v_elem -> 'ExternalRaised' ->> 'instance';
            ELSIF v_elem ? 'CancelInstance' THEN
                v_target_instance := v_elem -> 'CancelInstance' ->> 'instance';
            ELSIF v_elem ? 'SubOrchCompleted' THEN
                v_target_instance := v_elem -> 'SubOrchCompleted' ->> 'parent_instance';
            ELSIF v_elem ? 'SubOrchFailed' THEN
                v_target_instance := v_elem -> 'SubOrchFailed' ->> 'parent_instance';
            ELSIF v_elem ? 'QueueMessage' THEN
                v_target_instance := v_elem -> 'QueueMessage' ->> 'instance';
            ELSE
                v_target_instance := v_instance_id;
            END IF;

            -- A timer becomes visible at its fire time (even a past one).
            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::text, v_visible_at, v_now);
        END LOOP;
    END IF;

    -- 11. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 12. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
        RAISE NOTICE 'restore: ack_orchestration_item was %; installed the fix of 0021_ack_locks_its_lease.sql', v_plan #>> '{ack_orchestration_item,definition}';
    END IF;

    IF v_plan #>> '{ack_orchestration_item,action}' = 'install 0021 1590e0fdb3965a379efa3aea63ee71cd' THEN
-- The body 0021_ack_locks_its_lease.sql installs (fingerprint 1590e0fdb3965a379efa3aea63ee71cd).
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb,
    p_cancelled_activities jsonb DEFAULT '[]'::jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Every timestamp written comes from the caller's clock.
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_parent_instance_id text;
    v_status text;
    v_output text;
    v_elem jsonb;
    v_activity jsonb;
    v_target_instance text;
    v_fire_at_ms bigint;
    v_visible_at timestamptz;
    v_terminal boolean;
BEGIN
    -- 1. The lease must exist and still be live. Lock its row until this
    --    ack commits (pack 0021), so that no fetch can take the instance over
    --    between this check and the delete of the batch below.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms
    FOR UPDATE;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- 2. Metadata.
    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';
    -- A terminal turn folds the KV delta into the store (step 7d). This set
    -- is not step 7's completed_at rule: ContinuedAsNew is terminal here.
    v_terminal := coalesce(v_status IN ('Completed', 'ContinuedAsNew', 'Failed'), false);

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id,
                               parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data',
               v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS h(ev, ord)
        ORDER BY h.ord;
    END IF;

    -- 7. Execution status; completed_at only for Completed/Failed, NULL otherwise.
    IF v_status IS NOT NULL THEN
        UPDATE executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_status IN ('Completed', 'Failed') THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7a. Pin the execution to a duroxide version (a JSON null skips this).
    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::integer,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::integer,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::integer
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7b. Custom status: 'set' stores the value, 'clear' nulls it; both bump
    --     the version. Any other action (or none) does nothing.
    IF p_metadata ->> 'custom_status_action' = 'set' THEN
        UPDATE instances i
        SET custom_status = p_metadata ->> 'custom_status_value',
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    ELSIF p_metadata ->> 'custom_status_action' = 'clear' THEN
        UPDATE instances i
        SET custom_status = NULL,
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 7c. KV mutations, in array order (later ones see earlier ones), go to
    --     kv_delta only: the net change since the instance's last terminal
    --     turn, a NULL value being a tombstone. kv_store keeps the state as
    --     of that turn, which is what fetch_orchestration_item's snapshot
    --     shows. A JSON null or a non-array kv_mutations fails with 22023;
    --     elements that are not objects have no action and are ignored.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                -- A missing or null value is a tombstone; a missing or null
                -- timestamp is the ack's own time.
                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value',
                        coalesce((v_elem ->> 'last_updated_at_ms')::bigint, p_now_ms))
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                -- A tombstone, whether or not the key exists anywhere.
                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', NULL, p_now_ms)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = NULL,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                -- Every delta key of the instance becomes a tombstone, then
                -- every stored key without a delta row gets one.
                UPDATE kv_delta d
                SET value = NULL,
                    last_updated_at_ms = p_now_ms
                WHERE d.instance_id = v_instance_id;

                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                SELECT s.instance_id, s.key, NULL, p_now_ms
                FROM kv_store s
                WHERE s.instance_id = v_instance_id
                  AND NOT EXISTS (
                      SELECT 1 FROM kv_delta d
                      WHERE d.instance_id = s.instance_id AND d.key = s.key);
            END IF;
        END LOOP;
    END IF;

    -- 7d. On a terminal turn, fold the instance's delta into kv_store (with
    --     or without mutations in this call): live values are upserted under
    --     this ack's execution id, tombstoned keys are deleted, and the
    --     delta is emptied.
    IF v_terminal THEN
        INSERT INTO kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
        SELECT d.instance_id, d.key, d.value, p_execution_id, d.last_updated_at_ms
        FROM kv_delta d
        WHERE d.instance_id = v_instance_id
          AND d.value IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE
        SET value = EXCLUDED.value,
            execution_id = EXCLUDED.execution_id,
            last_updated_at_ms = EXCLUDED.last_updated_at_ms;

        DELETE FROM kv_store s
        USING kv_delta d
        WHERE s.instance_id = v_instance_id
          AND d.instance_id = s.instance_id
          AND d.key = s.key
          AND d.value IS NULL;

        DELETE FROM kv_delta d
        WHERE d.instance_id = v_instance_id;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity, session and tag.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id, tag)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
        END LOOP;
    END IF;

    -- 9. Cancel activities, after the worker items were inserted, so that an
    --    activity scheduled and cancelled in the same turn ends up absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord) ORDER BY c.ord
        LOOP
            DELETE FROM worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::bigint
              AND w.activity_id = (v_elem ->> 'activity_id')::bigint;
        END LOOP;
    END IF;

    -- 10. Enqueue orchestrator items, routed by work-item variant.
    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord) ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::bigint;
            ELSIF v_elem ? 'ActivityCompleted' THEN
                v_target_instance := v_elem -> 'ActivityCompleted' ->> 'instance';
            ELSIF v_elem ? 'ActivityFailed' THEN
                v_target_instance := v_elem -> 'ActivityFailed' ->> 'instance';
            ELSIF v_elem ? 'ExternalRaised' THEN
                v_target_instance := v_elem -> 'ExternalRaised' ->> 'instance';
            ELSIF v_elem ? 'CancelInstance' THEN
                v_target_instance := v_elem -> 'CancelInstance' ->> 'instance';
            ELSIF v_elem ? 'SubOrchCompleted' THEN
                v_target_instance := v_elem -> 'SubOrchCompleted' ->> 'parent_instance';
            ELSIF v_elem ? 'SubOrchFailed' THEN
                v_target_instance := v_elem -> 'SubOrchFailed' ->> 'parent_instance';
            ELSIF v_elem ? 'QueueMessage' THEN
                v_target_instance := v_elem -> 'QueueMessage' ->> 'instance';
            ELSE
                v_target_instance := v_instance_id;
            END IF;

            -- A timer becomes visible at its fire time (even a past one).
            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::text, v_visible_at, v_now);
        END LOOP;
    END IF;

    -- 11. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 12. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
        RAISE NOTICE 'restore: ack_orchestration_item was %; installed the fix of 0021_ack_locks_its_lease.sql', v_plan #>> '{ack_orchestration_item,definition}';
    END IF;

    IF v_plan #>> '{ack_orchestration_item,action}' = 'install 0021 3c40c93291f39a183831b567442fecd2' THEN
-- The body 0021_ack_locks_its_lease.sql installs (fingerprint 3c40c93291f39a183831b567442fecd2).
CREATE OR REPLACE FUNCTION ack_orchestration_item(
    p_lock_token text,
    p_now_ms bigint,
    p_execution_id bigint,
    p_history_delta jsonb,
    p_worker_items jsonb,
    p_orchestrator_items jsonb,
    p_metadata jsonb,
    p_cancelled_activities jsonb DEFAULT '[]'::jsonb
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Every timestamp written comes from the caller's clock.
    v_now timestamptz := to_timestamp(p_now_ms / 1000.0);
    v_instance_id text;
    v_orchestration_name text;
    v_orchestration_version text;
    v_parent_instance_id text;
    v_status text;
    v_output text;
    v_elem jsonb;
    v_activity jsonb;
    v_target_instance text;
    v_fire_at_ms bigint;
    v_visible_at timestamptz;
    v_terminal boolean;
BEGIN
    -- 1. The lease must exist and still be live. Lock its row until this
    --    ack commits (pack 0021), so that no fetch can take the instance over
    --    between this check and the delete of the batch below.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms
    FOR UPDATE;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Invalid lock token';
    END IF;

    -- 2. Metadata.
    v_orchestration_name := p_metadata ->> 'orchestration_name';
    v_orchestration_version := p_metadata ->> 'orchestration_version';
    v_parent_instance_id := p_metadata ->> 'parent_instance_id';
    v_status := p_metadata ->> 'status';
    v_output := p_metadata ->> 'output';
    -- A terminal turn (ContinuedAsNew included) records its completion
    -- time (step 7) and folds the KV delta into the store (step 7d).
    v_terminal := coalesce(v_status IN ('Completed', 'ContinuedAsNew', 'Failed'), false);

    -- 3. Create or refresh the instance row (only when name and version are known).
    IF v_orchestration_name IS NOT NULL AND v_orchestration_version IS NOT NULL THEN
        INSERT INTO instances (instance_id, orchestration_name, orchestration_version, current_execution_id,
                               parent_instance_id, created_at, updated_at)
        VALUES (v_instance_id, v_orchestration_name, v_orchestration_version, p_execution_id,
                v_parent_instance_id, v_now, v_now)
        ON CONFLICT (instance_id) DO NOTHING;

        -- A parent, once recorded, is never overwritten.
        UPDATE instances i
        SET orchestration_name = v_orchestration_name,
            orchestration_version = v_orchestration_version,
            parent_instance_id = COALESCE(i.parent_instance_id, v_parent_instance_id),
            updated_at = v_now
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 4. Ensure the execution row (even when no instance row exists).
    INSERT INTO executions (instance_id, execution_id, status, started_at)
    VALUES (v_instance_id, p_execution_id, 'Running', v_now)
    ON CONFLICT (instance_id, execution_id) DO NOTHING;

    -- 5. The current execution never moves backwards.
    UPDATE instances i
    SET current_execution_id = GREATEST(i.current_execution_id, p_execution_id),
        updated_at = v_now
    WHERE i.instance_id = v_instance_id;

    -- 6. Append the history delta (no conflict handling).
    IF p_history_delta IS NOT NULL AND jsonb_array_length(p_history_delta) > 0 THEN
        INSERT INTO history (instance_id, execution_id, event_id, event_type, event_data, created_at)
        SELECT v_instance_id, p_execution_id, (h.ev ->> 'event_id')::bigint, h.ev ->> 'event_type', h.ev ->> 'event_data',
               v_now
        FROM jsonb_array_elements(p_history_delta) WITH ORDINALITY AS h(ev, ord)
        ORDER BY h.ord;
    END IF;

    -- 7. Execution status; completed_at on a terminal turn, NULL otherwise.
    IF v_status IS NOT NULL THEN
        UPDATE executions e
        SET status = v_status,
            output = v_output,
            completed_at = CASE WHEN v_terminal THEN v_now ELSE NULL END
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7a. Pin the execution to a duroxide version (a JSON null skips this).
    IF p_metadata ? 'pinned_duroxide_version'
       AND p_metadata ->> 'pinned_duroxide_version' IS NOT NULL
       AND p_metadata ->> 'pinned_duroxide_version' <> 'null' THEN
        UPDATE executions e
        SET duroxide_version_major = (p_metadata -> 'pinned_duroxide_version' ->> 'major')::integer,
            duroxide_version_minor = (p_metadata -> 'pinned_duroxide_version' ->> 'minor')::integer,
            duroxide_version_patch = (p_metadata -> 'pinned_duroxide_version' ->> 'patch')::integer
        WHERE e.instance_id = v_instance_id
          AND e.execution_id = p_execution_id;
    END IF;

    -- 7b. Custom status: 'set' stores the value, 'clear' nulls it; both bump
    --     the version. Any other action (or none) does nothing.
    IF p_metadata ->> 'custom_status_action' = 'set' THEN
        UPDATE instances i
        SET custom_status = p_metadata ->> 'custom_status_value',
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    ELSIF p_metadata ->> 'custom_status_action' = 'clear' THEN
        UPDATE instances i
        SET custom_status = NULL,
            custom_status_version = i.custom_status_version + 1
        WHERE i.instance_id = v_instance_id;
    END IF;

    -- 7c. KV mutations, in array order (later ones see earlier ones), go to
    --     kv_delta only: the net change since the instance's last terminal
    --     turn, a NULL value being a tombstone. kv_store keeps the state as
    --     of that turn, which is what fetch_orchestration_item's snapshot
    --     shows. A JSON null or a non-array kv_mutations fails with 22023;
    --     elements that are not objects have no action and are ignored.
    IF p_metadata -> 'kv_mutations' IS NOT NULL AND jsonb_array_length(p_metadata -> 'kv_mutations') > 0 THEN
        FOR v_elem IN
            SELECT m.item FROM jsonb_array_elements(p_metadata -> 'kv_mutations') WITH ORDINALITY AS m(item, ord)
            ORDER BY m.ord
        LOOP
            IF v_elem ->> 'action' = 'set' THEN
                -- A missing or null value is a tombstone; a missing or null
                -- timestamp is the ack's own time.
                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', v_elem ->> 'value',
                        coalesce((v_elem ->> 'last_updated_at_ms')::bigint, p_now_ms))
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = EXCLUDED.value,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_key' THEN
                -- A tombstone, whether or not the key exists anywhere.
                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                VALUES (v_instance_id, v_elem ->> 'key', NULL, p_now_ms)
                ON CONFLICT (instance_id, key) DO UPDATE
                SET value = NULL,
                    last_updated_at_ms = EXCLUDED.last_updated_at_ms;
            ELSIF v_elem ->> 'action' = 'clear_all' THEN
                -- Every delta key of the instance becomes a tombstone, then
                -- every stored key without a delta row gets one.
                UPDATE kv_delta d
                SET value = NULL,
                    last_updated_at_ms = p_now_ms
                WHERE d.instance_id = v_instance_id;

                INSERT INTO kv_delta (instance_id, key, value, last_updated_at_ms)
                SELECT s.instance_id, s.key, NULL, p_now_ms
                FROM kv_store s
                WHERE s.instance_id = v_instance_id
                  AND NOT EXISTS (
                      SELECT 1 FROM kv_delta d
                      WHERE d.instance_id = s.instance_id AND d.key = s.key);
            END IF;
        END LOOP;
    END IF;

    -- 7d. On a terminal turn, fold the instance's delta into kv_store (with
    --     or without mutations in this call): live values are upserted under
    --     this ack's execution id, tombstoned keys are deleted, and the
    --     delta is emptied.
    IF v_terminal THEN
        INSERT INTO kv_store (instance_id, key, value, execution_id, last_updated_at_ms)
        SELECT d.instance_id, d.key, d.value, p_execution_id, d.last_updated_at_ms
        FROM kv_delta d
        WHERE d.instance_id = v_instance_id
          AND d.value IS NOT NULL
        ON CONFLICT (instance_id, key) DO UPDATE
        SET value = EXCLUDED.value,
            execution_id = EXCLUDED.execution_id,
            last_updated_at_ms = EXCLUDED.last_updated_at_ms;

        DELETE FROM kv_store s
        USING kv_delta d
        WHERE s.instance_id = v_instance_id
          AND d.instance_id = s.instance_id
          AND d.key = s.key
          AND d.value IS NULL;

        DELETE FROM kv_delta d
        WHERE d.instance_id = v_instance_id;
    END IF;

    -- 8. Enqueue worker items; ActivityExecute items carry their identity, session and tag.
    IF p_worker_items IS NOT NULL AND jsonb_array_length(p_worker_items) > 0 THEN
        FOR v_elem IN
            SELECT w.item FROM jsonb_array_elements(p_worker_items) WITH ORDINALITY AS w(item, ord) ORDER BY w.ord
        LOOP
            v_activity := v_elem -> 'ActivityExecute';
            INSERT INTO worker_queue (work_item, visible_at, created_at, instance_id, execution_id, activity_id,
                                      session_id, tag)
            VALUES (v_elem::text, v_now, v_now,
                    v_activity ->> 'instance',
                    (v_activity ->> 'execution_id')::bigint,
                    (v_activity ->> 'id')::bigint,
                    v_activity ->> 'session_id',
                    v_activity ->> 'tag');
        END LOOP;
    END IF;

    -- 9. Cancel activities, after the worker items were inserted, so that an
    --    activity scheduled and cancelled in the same turn ends up absent.
    IF p_cancelled_activities IS NOT NULL AND jsonb_array_length(p_cancelled_activities) > 0 THEN
        FOR v_elem IN
            SELECT c.item FROM jsonb_array_elements(p_cancelled_activities) WITH ORDINALITY AS c(item, ord) ORDER BY c.ord
        LOOP
            DELETE FROM worker_queue w
            WHERE w.instance_id = v_elem ->> 'instance'
              AND w.execution_id = (v_elem ->> 'execution_id')::bigint
              AND w.activity_id = (v_elem ->> 'activity_id')::bigint;
        END LOOP;
    END IF;

    -- 10. Enqueue orchestrator items, routed by work-item variant.
    IF p_orchestrator_items IS NOT NULL AND jsonb_array_length(p_orchestrator_items) > 0 THEN
        FOR v_elem IN
            SELECT o.item FROM jsonb_array_elements(p_orchestrator_items) WITH ORDINALITY AS o(item, ord) ORDER BY o.ord
        LOOP
            v_fire_at_ms := NULL;
            IF v_elem ? 'StartOrchestration' THEN
                v_target_instance := v_elem -> 'StartOrchestration' ->> 'instance';
            ELSIF v_elem ? 'ContinueAsNew' THEN
                v_target_instance := v_elem -> 'ContinueAsNew' ->> 'instance';
            ELSIF v_elem ? 'TimerFired' THEN
                v_target_instance := v_elem -> 'TimerFired' ->> 'instance';
                v_fire_at_ms := (v_elem -> 'TimerFired' ->> 'fire_at_ms')::bigint;
            ELSIF v_elem ? 'ActivityCompleted' THEN
                v_target_instance := v_elem -> 'ActivityCompleted' ->> 'instance';
            ELSIF v_elem ? 'ActivityFailed' THEN
                v_target_instance := v_elem -> 'ActivityFailed' ->> 'instance';
            ELSIF v_elem ? 'ExternalRaised' THEN
                v_target_instance := v_elem -> 'ExternalRaised' ->> 'instance';
            ELSIF v_elem ? 'CancelInstance' THEN
                v_target_instance := v_elem -> 'CancelInstance' ->> 'instance';
            ELSIF v_elem ? 'SubOrchCompleted' THEN
                v_target_instance := v_elem -> 'SubOrchCompleted' ->> 'parent_instance';
            ELSIF v_elem ? 'SubOrchFailed' THEN
                v_target_instance := v_elem -> 'SubOrchFailed' ->> 'parent_instance';
            ELSIF v_elem ? 'QueueMessage' THEN
                v_target_instance := v_elem -> 'QueueMessage' ->> 'instance';
            ELSE
                v_target_instance := v_instance_id;
            END IF;

            -- A timer becomes visible at its fire time (even a past one).
            IF v_fire_at_ms IS NOT NULL AND v_fire_at_ms > 0 THEN
                v_visible_at := to_timestamp(v_fire_at_ms / 1000.0);
            ELSE
                v_visible_at := v_now;
            END IF;

            INSERT INTO orchestrator_queue (instance_id, work_item, visible_at, created_at)
            VALUES (v_target_instance, v_elem::text, v_visible_at, v_now);
        END LOOP;
    END IF;

    -- 11. Consume the messages claimed by this lease.
    DELETE FROM orchestrator_queue q
    WHERE q.lock_token = p_lock_token;

    -- 12. Release the lease.
    DELETE FROM instance_locks l
    WHERE l.instance_id = v_instance_id
      AND l.lock_token = p_lock_token;
END;
$fn$;
        RAISE NOTICE 'restore: ack_orchestration_item was %; installed the fix of 0021_ack_locks_its_lease.sql', v_plan #>> '{ack_orchestration_item,definition}';
    END IF;

    IF v_plan #>> '{fetch_work_item,action}' = 'install 0035 6aaf60e360e8942b6b740a1382e2207e' THEN
-- The body 0035_worker_fetch_leases_bounded_by_the_database_clock.sql installs (fingerprint 6aaf60e360e8942b6b740a1382e2207e).
CREATE OR REPLACE FUNCTION fetch_work_item(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only'
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many sessions are tried per call.
    c_max_candidates CONSTANT integer := 32;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;
    -- Advisory lock class of session claims, in the two-key space (the
    -- orchestration fetch's instance locks use the one-key space).
    c_session_claim CONSTANT integer := 1400;
    -- Advisory lock class of item claims, next to the sessions' (two-key
    -- space): the second key is the item id folded into an integer.
    c_item_claim CONSTANT integer := 1401;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before returning
    v_lease_start bigint;
    v_tried text[] := '{}';
    v_tried_items bigint[] := ARRAY[]::bigint[];
    v_id bigint;
    v_session_id text;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
    v_lock_token text;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_item: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_item: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    FOR v_attempt IN 1..c_max_candidates LOOP
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        v_session_id := NULL;
        -- The visibility bound, where the planner can read it: a generic
        -- plan of a variable's bound walked every item scheduled for later
        -- (see the header). Local to this call (the SET clause restores it).
        -- The query reads it with missing_ok: outside a call (a static
        -- check plans the query) there is none, and a NULL bound matches
        -- no row.
        PERFORM set_config('duroxide.fetch_visible_ms', v_now_ms::text, true);

        -- Candidate: the lowest id that is visible and unleased by the
        -- caller's clock, row-locked without waiting (SKIP LOCKED).
        IF p_owner_id IS NULL THEN
            -- Without an owner, session-bound items are never eligible.
            SELECT q.id INTO v_id
            FROM worker_queue q
            WHERE q.visible_at <= to_timestamp(current_setting('duroxide.fetch_visible_ms', true)::bigint / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND q.session_id IS NULL
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        ELSE
            -- With an owner: items without a session, items of a live
            -- session this owner holds, and items of a session with no live
            -- row, leaving out the sessions this call already skipped.
            SELECT q.id, q.session_id INTO v_id, v_session_id
            FROM worker_queue q
            LEFT JOIN sessions s
                   ON s.session_id = q.session_id
                  AND s.locked_until > v_now_ms
            WHERE q.visible_at <= to_timestamp(current_setting('duroxide.fetch_visible_ms', true)::bigint / 1000.0)
              AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
              AND (q.session_id IS NULL
                   OR ((s.worker_id = p_owner_id OR s.session_id IS NULL)
                       AND NOT (q.session_id = ANY (v_tried))))
              -- Tag routing; an unknown or NULL mode matches nothing.
              AND CASE p_tag_mode
                      WHEN 'default_only' THEN q.tag IS NULL
                      WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                      WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                      WHEN 'any' THEN true
                      ELSE false
                  END
              AND NOT (q.id = ANY (v_tried_items))
            ORDER BY q.id
            LIMIT 1;
        END IF;

        IF NOT FOUND THEN
            RETURN;  -- nothing claimable
        END IF;

        -- Claim the item without waiting (an advisory try-lock: another
        -- call trying the same item moves on), then lock its row in a new
        -- statement, whose snapshot is taken after the claim: a row another
        -- call leased meanwhile is rejected by the re-check before it is
        -- locked, so no call locks a row it does not take, and none waits
        -- on the newer version of a row it saw (see the header).
        v_tried_items := v_tried_items || v_id;
        IF NOT pg_try_advisory_xact_lock(c_item_claim, (v_id % 2147483647)::integer) THEN
            CONTINUE;
        END IF;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        PERFORM 1 FROM worker_queue q
         WHERE q.id = v_id
           AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
           AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE;
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it: a session another call is claiming, or whose row another
        -- session holds (a renewal, an activity stamp, a cleanup), is
        -- skipped with all its items, and the next candidate is tried.
        IF v_session_id IS NOT NULL THEN
            v_tried := v_tried || v_session_id;
            IF NOT pg_try_advisory_xact_lock(c_session_claim, hashtext(v_session_id)) THEN
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_session_id
            FOR UPDATE SKIP LOCKED;

            IF FOUND THEN
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    CONTINUE;  -- another owner took it since the candidate query
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_session_id) THEN
                    CONTINUE;  -- the row exists and another session holds it
                END IF;
                -- No row: create it (the lease is written below). Only a
                -- call holding the claim lock inserts, so this cannot wait.
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;
        END IF;

        -- The leases start now, after every step that could take time: the
        -- caller's clock, or the database's when that is later, by at most
        -- c_lease_bound_ms; plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms);

        IF v_session_id IS NOT NULL THEN
            -- A session this owner already holds keeps a later expiry and a
            -- later activity stamp than these.
            UPDATE sessions
               SET worker_id = p_owner_id,
                   locked_until = greatest(v_session_until,
                       v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
                   last_activity_at = greatest(v_session_activity, v_now_ms)
             WHERE session_id = v_session_id;
        END IF;

        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue
           SET lock_token = v_lock_token,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = attempt_count + 1
         WHERE id = v_id
        RETURNING work_item, attempt_count INTO out_work_item, out_attempt_count;

        out_lock_token := v_lock_token;
        RETURN NEXT;
        RETURN;
    END LOOP;
    -- Every session tried was contended: no row, the caller polls again.
END;
$fn$;
        RAISE NOTICE 'restore: fetch_work_item was %; installed the fix of 0035_worker_fetch_leases_bounded_by_the_database_clock.sql', v_plan #>> '{fetch_work_item,definition}';
    END IF;

    IF v_plan #>> '{renew_work_item_lock,action}' = 'install 0036 1492548829d855cbc0980265cce838ff' THEN
-- The body 0036_renewals_bounded_by_the_database_clock.sql installs (fingerprint 1492548829d855cbc0980265cce838ff).
CREATE OR REPLACE FUNCTION renew_work_item_lock(
    p_lock_token text,
    p_now_ms bigint,
    p_extend_secs bigint
)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Longest extension accepted: one day.
    c_max_extend_secs CONSTANT bigint := 86400;
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;
    v_session_id text;
    v_row_count bigint;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'renew_work_item_lock: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_extend_secs IS NULL OR p_extend_secs < 0 OR p_extend_secs > c_max_extend_secs THEN
        RAISE EXCEPTION 'renew_work_item_lock: p_extend_secs must be between 0 and % seconds, got %',
            c_max_extend_secs, p_extend_secs
            USING ERRCODE = '22023';
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    -- Lock the token's row first. This can wait (an ack, an abandon, or a
    -- fetch re-claiming a lease it judged expired holds it); everything
    -- below is decided after the wait, against the newest row.
    SELECT q.session_id INTO v_session_id
    FROM worker_queue q
    WHERE q.lock_token = p_lock_token
    FOR UPDATE;

    -- The new expiry: from the caller's clock, or from the database's when
    -- that is later, by at most c_lease_bound_ms; plus the extension; a
    -- later expiry already written is kept.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    UPDATE worker_queue
       SET locked_until = greatest(locked_until, v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms) + p_extend_secs * 1000)
     WHERE lock_token = p_lock_token
       AND locked_until > v_now_ms;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    IF v_row_count = 0 THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already acked';
    END IF;

    -- Session piggy-back: stamp activity on a still-live session (no owner
    -- check, locked_until unchanged), after the wait for its row.
    IF v_session_id IS NOT NULL THEN
        PERFORM 1 FROM sessions s WHERE s.session_id = v_session_id FOR UPDATE;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        UPDATE sessions
           SET last_activity_at = greatest(last_activity_at, v_now_ms)
         WHERE session_id = v_session_id
           AND locked_until > v_now_ms;
    END IF;
END;
$fn$;
        RAISE NOTICE 'restore: renew_work_item_lock was %; installed the fix of 0036_renewals_bounded_by_the_database_clock.sql', v_plan #>> '{renew_work_item_lock,definition}';
    END IF;

    IF v_plan #>> '{renew_session_lock,action}' = 'install 0036 a8ff1289c6d43cde73eb8eb8e6546ad5' THEN
-- The body 0036_renewals_bounded_by_the_database_clock.sql installs (fingerprint a8ff1289c6d43cde73eb8eb8e6546ad5).
CREATE OR REPLACE FUNCTION renew_session_lock(
    p_owner_ids text[],
    p_now_ms bigint,
    p_extend_ms bigint,
    p_idle_timeout_ms bigint
)
RETURNS bigint
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Longest extension accepted: one day.
    c_max_extend_ms CONSTANT bigint := 86400000;
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;
    v_locked text[];
    v_row_count bigint;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'renew_session_lock: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_extend_ms IS NULL OR p_extend_ms < 0 OR p_extend_ms > c_max_extend_ms THEN
        RAISE EXCEPTION 'renew_session_lock: p_extend_ms must be between 0 and % milliseconds, got %',
            c_max_extend_ms, p_extend_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_idle_timeout_ms IS NULL OR p_idle_timeout_ms < 0 THEN
        RAISE EXCEPTION 'renew_session_lock: p_idle_timeout_ms must be a non-negative number of milliseconds, got %', p_idle_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    -- Lock the owners' live sessions first, in a fixed order. This can
    -- wait (a fetch, an activity stamp or a cleanup holds a row); a row
    -- taken over by another owner meanwhile drops out.
    SELECT array_agg(l.session_id) INTO v_locked
    FROM (
        SELECT s.session_id
        FROM sessions s
        WHERE s.worker_id = ANY(p_owner_ids)
          AND s.locked_until > p_now_ms
        ORDER BY s.session_id
        FOR UPDATE
    ) l;

    -- Extend the live, non-idle ones, judged after the wait: from the
    -- caller's clock, or from the database's when that is later, by at most
    -- c_lease_bound_ms; plus the extension; a later expiry already written
    -- (by a fetch) is kept. Renewing is not activity.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    UPDATE sessions
       SET locked_until = greatest(locked_until, v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms) + p_extend_ms)
     WHERE session_id = ANY(v_locked)
       AND worker_id = ANY(p_owner_ids)
       AND locked_until > v_now_ms
       AND last_activity_at > v_now_ms - p_idle_timeout_ms;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    RETURN v_row_count;
END;
$fn$;
        RAISE NOTICE 'restore: renew_session_lock was %; installed the fix of 0036_renewals_bounded_by_the_database_clock.sql', v_plan #>> '{renew_session_lock,definition}';
    END IF;

    IF v_plan #>> '{renew_orchestration_item_lock,action}' = 'install 0036 ed37d76d6c56072838feed4d25ab03a4' THEN
-- The body 0036_renewals_bounded_by_the_database_clock.sql installs (fingerprint ed37d76d6c56072838feed4d25ab03a4).
CREATE OR REPLACE FUNCTION renew_orchestration_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Longest extension accepted: one day.
    c_max_extend_secs CONSTANT bigint := 86400;
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;
    v_instance_id text;
    v_locked_until bigint;
BEGIN
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'renew_orchestration_item_lock: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_extend_secs IS NULL OR p_extend_secs < 0 OR p_extend_secs > c_max_extend_secs THEN
        RAISE EXCEPTION 'renew_orchestration_item_lock: p_extend_secs must be between 0 and % seconds, got %',
            c_max_extend_secs, p_extend_secs
            USING ERRCODE = '22023';
    END IF;

    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;

    -- Lock the lease row first, through idx_instance_locks_lock_token, and
    -- read it once. This can wait (an ack in flight holds it from its lease
    -- check on); everything below is decided after the wait, against the
    -- newest row (a row whose token changed or that was deleted while the
    -- call waited is not found).
    SELECT l.instance_id, l.locked_until INTO v_instance_id, v_locked_until
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
    FOR UPDATE;

    -- The new expiry: from the caller's clock, or from the database's when
    -- that is later, by at most c_lease_bound_ms; plus the extension; a
    -- later expiry already written is kept.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    IF v_instance_id IS NULL OR v_locked_until <= v_now_ms THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already released';
    END IF;
    v_locked_until := greatest(v_locked_until, v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms) + p_extend_secs * 1000);

    -- The row is locked: write it by its primary key.
    UPDATE instance_locks l
       SET locked_until = v_locked_until
     WHERE l.instance_id = v_instance_id;

    -- The claimed messages carry the lease's expiry.
    UPDATE orchestrator_queue q
       SET locked_until = v_locked_until
     WHERE q.lock_token = p_lock_token;
END;
$fn$;
        RAISE NOTICE 'restore: renew_orchestration_item_lock was %; installed the fix of 0036_renewals_bounded_by_the_database_clock.sql', v_plan #>> '{renew_orchestration_item_lock,definition}';
    END IF;

    IF v_plan #>> '{orchestrator_queue_head_offer,action}' = 'install 0030 fea1358d03c8230beee9491765797530' THEN
        LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;
-- The body 0030_queue_heads_by_row_lock.sql installs (fingerprint fea1358d03c8230beee9491765797530).
CREATE OR REPLACE FUNCTION orchestrator_queue_head_offer(p_instance_id text, p_visible_at timestamptz, p_id bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    -- The instance's head row, locked FOR KEY SHARE until this transaction
    -- ends: shared with every other offer of the instance, it keeps out a
    -- refresh (FOR UPDATE, never waited for), so no refresh moves the head
    -- past this message or deletes it before the message commits. A
    -- refresh holding the row makes this wait for it, then read the row as
    -- that refresh left it.
    SELECT h.visible_at, h.id INTO v_visible_at, v_id
    FROM orchestrator_queue_heads h
    WHERE h.instance_id = p_instance_id
    FOR KEY SHARE;
    IF FOUND AND (v_visible_at, v_id) <= (p_visible_at, p_id) THEN
        RETURN;  -- the common case: a message behind an existing head
    END IF;
    -- The instance's first message, or one older than its head. The row
    -- this inserts, or the one it conflicts with (locked even when the
    -- WHERE leaves it unchanged), stays locked until this transaction ends.
    INSERT INTO orchestrator_queue_heads AS h (instance_id, visible_at, id)
    VALUES (p_instance_id, p_visible_at, p_id)
    ON CONFLICT (instance_id) DO UPDATE
       SET visible_at = EXCLUDED.visible_at, id = EXCLUDED.id
     WHERE (h.visible_at, h.id) > (EXCLUDED.visible_at, EXCLUDED.id);
END;
$fn$;
        RAISE NOTICE 'restore: orchestrator_queue_head_offer was %; installed the fix of 0030_queue_heads_by_row_lock.sql', v_plan #>> '{orchestrator_queue_head_offer,definition}';
    END IF;

    IF v_plan #>> '{orchestrator_queue_head_refresh,action}' = 'install 0037 6cd2781ed00a3dc44f2d5a0fc285bbd5' THEN
-- The body 0037_queue_head_refresh_plans_by_its_instance.sql installs (fingerprint 6cd2781ed00a3dc44f2d5a0fc285bbd5).
CREATE OR REPLACE FUNCTION orchestrator_queue_head_refresh(p_instance_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_sort = off
SET enable_incremental_sort = off
AS $fn$
-- Planned with sorts off (0037): the instance's oldest message is read in
-- the order of idx_orch_instance_head, never found by sorting what a
-- scan of another index returned.
DECLARE
    v_visible_at timestamptz;
    v_id bigint;
BEGIN
    -- The head row, locked exclusively, never waiting: when a transaction
    -- that offered a message of the instance holds it, that message may
    -- still commit and the head must cover it, so it stays as it is (early,
    -- which is safe); so too when another refresh holds it, or there is no
    -- head to refresh.
    PERFORM 1
    FROM orchestrator_queue_heads h
    WHERE h.instance_id = p_instance_id
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    -- A new statement, so a new snapshot: every offer that held the row
    -- has ended, and a new one waits for this transaction.
    SELECT q.visible_at, q.id INTO v_visible_at, v_id
    FROM orchestrator_queue q
    WHERE q.instance_id = p_instance_id
    ORDER BY q.visible_at, q.id
    LIMIT 1;
    IF FOUND THEN
        UPDATE orchestrator_queue_heads h
           SET visible_at = v_visible_at, id = v_id
         WHERE h.instance_id = p_instance_id
           AND (h.visible_at, h.id) IS DISTINCT FROM (v_visible_at, v_id);
    ELSE
        DELETE FROM orchestrator_queue_heads WHERE instance_id = p_instance_id;
    END IF;
END;
$fn$;
        RAISE NOTICE 'restore: orchestrator_queue_head_refresh was %; installed the fix of 0037_queue_head_refresh_plans_by_its_instance.sql', v_plan #>> '{orchestrator_queue_head_refresh,definition}';
    END IF;

    IF v_plan #>> '{orchestrator_queue_heads_after_delete,action}' = 'install 0030 2cb700ddb12dc3edfe73edbb7d130bf8' THEN
        LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;
-- The body 0030_queue_heads_by_row_lock.sql installs (fingerprint 2cb700ddb12dc3edfe73edbb7d130bf8).
CREATE OR REPLACE FUNCTION orchestrator_queue_heads_after_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
SET enable_indexonlyscan = off
AS $fn$
DECLARE
    v_id bigint;
BEGIN
    -- The head by its primary key alone (the message's id compared here,
    -- not in the query; with index-only scans off, idx_orch_heads_order,
    -- which covers every column, is no cheaper than the key).
    SELECT h.id INTO v_id
    FROM orchestrator_queue_heads h
    WHERE h.instance_id = OLD.instance_id;
    IF FOUND AND v_id = OLD.id THEN
        PERFORM orchestrator_queue_head_refresh(OLD.instance_id);
    END IF;
    RETURN NULL;
END;
$fn$;
        RAISE NOTICE 'restore: orchestrator_queue_heads_after_delete was %; installed the fix of 0030_queue_heads_by_row_lock.sql', v_plan #>> '{orchestrator_queue_heads_after_delete,definition}';
    END IF;

    IF v_plan #>> '{fetch_work_items,action}' = 'install 0035 fcdb3c264106b44e723aa4208d7a525c' THEN
-- The body 0035_worker_fetch_leases_bounded_by_the_database_clock.sql installs (fingerprint fcdb3c264106b44e723aa4208d7a525c).
CREATE OR REPLACE FUNCTION fetch_work_items(
    p_now_ms bigint,
    p_lock_timeout_ms bigint,
    p_owner_id text DEFAULT NULL,
    p_session_lock_timeout_ms bigint DEFAULT NULL,
    p_tag_filter text[] DEFAULT NULL,
    p_tag_mode text DEFAULT 'default_only',
    p_max_items integer DEFAULT 1,
    p_max_new_sessions integer DEFAULT 0
)
RETURNS TABLE(out_work_item text, out_lock_token text, out_attempt_count integer)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- At most this many candidates are read per call (upstream's bound).
    c_max_scan CONSTANT integer := 1024;
    -- Longest lease accepted: one day.
    c_max_lock_timeout_ms CONSTANT bigint := 86400000;
    -- The most the database clock may move a lease's start past the
    -- caller's clock carried forward (the header's "Lease bound" line).
    c_lease_bound_ms CONSTANT bigint := 30000;
    -- Advisory lock classes of session and item claims, in the two-key
    -- space: fetch_work_item's (0025, 0028), so that a single and a
    -- batched fetch exclude each other.
    c_session_claim CONSTANT integer := 1400;
    c_item_claim CONSTANT integer := 1401;

    v_scan integer;
    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;       -- database clock, read just before the leases
    v_lease_start bigint;
    v_candidate record;
    v_taken bigint[] := ARRAY[]::bigint[];
    -- The sessions this call holds, with the expiry and activity stamp
    -- each keeps if later than the call's (NULL: none to keep).
    v_held text[] := '{}';
    v_held_until bigint[] := ARRAY[]::bigint[];
    v_held_activity bigint[] := ARRAY[]::bigint[];
    -- The sessions this call leaves (contended, another owner's, or over
    -- the new-session budget), with all their items.
    v_left text[] := '{}';
    v_new_sessions integer := 0;
    v_is_new boolean;
    v_locked boolean;
    -- The claims this call holds at session level while it takes a row
    -- lock (NULL: none): released as soon as the row lock is taken or
    -- refused, and by the handler below on an error.
    v_item_claim integer;
    v_session_claim integer;
    v_session_owner text;
    v_session_until bigint;
    v_session_activity bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fetch_work_items requires READ COMMITTED isolation, got %',
            current_setting('transaction_isolation');
    END IF;
    IF p_now_ms IS NULL OR p_now_ms < 0 THEN
        RAISE EXCEPTION 'fetch_work_items: p_now_ms must be a non-negative epoch time in milliseconds, got %', p_now_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_lock_timeout_ms IS NULL OR p_lock_timeout_ms <= 0 OR p_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_items: p_lock_timeout_ms must be between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;
    IF p_session_lock_timeout_ms <= 0 OR p_session_lock_timeout_ms > c_max_lock_timeout_ms THEN
        RAISE EXCEPTION 'fetch_work_items: p_session_lock_timeout_ms must be NULL or between 1 and % milliseconds, got %',
            c_max_lock_timeout_ms, p_session_lock_timeout_ms
            USING ERRCODE = '22023';
    END IF;

    IF p_max_items IS NULL OR p_max_items <= 0 OR p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_scan := least(greatest(p_max_items::bigint * 4, p_max_items), c_max_scan)::integer;
    v_stmt_ms := floor(extract(epoch FROM statement_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);

    -- The candidates, visible and unleased by the caller's clock, read
    -- without a row lock: each is claimed below, one by one, never waiting.
    -- A claim is held only until the row lock it guards is taken (the row
    -- lock then holds the item, or the session, to the commit): one claim
    -- at a time, not one per row for the whole call. Claims live at
    -- session level for that; the handler at the end of this block
    -- releases one an error leaves held.
    BEGIN
    FOR v_candidate IN
        SELECT q.id, q.session_id, s.worker_id AS live_owner
        FROM worker_queue q
        LEFT JOIN sessions s
               ON s.session_id = q.session_id
              AND s.locked_until > v_now_ms
        WHERE q.visible_at <= to_timestamp(v_now_ms / 1000.0)
          AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
          -- Without an owner, session-bound items are never eligible; with
          -- one, those of a session this owner holds or nobody holds.
          AND (q.session_id IS NULL
               OR (p_owner_id IS NOT NULL
                   AND (s.session_id IS NULL OR s.worker_id = p_owner_id)))
          -- Tag routing; an unknown or NULL mode matches nothing.
          AND CASE p_tag_mode
                  WHEN 'default_only' THEN q.tag IS NULL
                  WHEN 'tags' THEN q.tag = ANY(p_tag_filter)
                  WHEN 'default_and' THEN q.tag IS NULL OR q.tag = ANY(p_tag_filter)
                  WHEN 'any' THEN true
                  ELSE false
              END
        ORDER BY q.session_id NULLS FIRST, q.id
        LIMIT v_scan
    LOOP
        EXIT WHEN cardinality(v_taken) >= p_max_items;

        IF v_candidate.session_id IS NOT NULL AND NOT (v_candidate.session_id = ANY (v_held)) THEN
            IF v_candidate.session_id = ANY (v_left) THEN
                CONTINUE;
            END IF;
            IF v_candidate.live_owner IS NULL AND v_new_sessions >= coalesce(p_max_new_sessions, 0) THEN
                CONTINUE;  -- a new session, and the budget is spent
            END IF;
        END IF;

        -- Claim the item without waiting, then re-check and lock its row in
        -- a new statement, whose snapshot follows the claim (0028): a row
        -- another call leased meanwhile fails the re-check unlocked.
        v_item_claim := (v_candidate.id % 2147483647)::integer;
        IF NOT pg_try_advisory_lock(c_item_claim, v_item_claim) THEN
            v_item_claim := NULL;
            CONTINUE;
        END IF;
        v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
        PERFORM 1 FROM worker_queue q
         WHERE q.id = v_candidate.id
           AND q.visible_at <= to_timestamp(v_now_ms / 1000.0)
           AND (q.lock_token IS NULL OR q.locked_until <= v_now_ms)
        FOR UPDATE SKIP LOCKED;
        v_locked := FOUND;
        -- Taken, the row lock holds the item from here to the commit: a
        -- call that claims it next re-checks it and skips the locked row.
        PERFORM pg_advisory_unlock(c_item_claim, v_item_claim);
        v_item_claim := NULL;
        IF NOT v_locked THEN
            CONTINUE;
        END IF;

        -- Claim (or keep) the item's session for this owner, never waiting
        -- on it (0025): a session another call is claiming, whose row
        -- another transaction holds, or that another owner took since the
        -- scan, is left with all its items.
        IF v_candidate.session_id IS NOT NULL AND NOT (v_candidate.session_id = ANY (v_held)) THEN
            v_session_claim := hashtext(v_candidate.session_id);
            IF NOT pg_try_advisory_lock(c_session_claim, v_session_claim) THEN
                v_session_claim := NULL;
                v_left := v_left || v_candidate.session_id;
                CONTINUE;
            END IF;

            SELECT s.worker_id, s.locked_until, s.last_activity_at
              INTO v_session_owner, v_session_until, v_session_activity
            FROM sessions s
            WHERE s.session_id = v_candidate.session_id
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                -- The row lock holds the session from here to the commit.
                PERFORM pg_advisory_unlock(c_session_claim, v_session_claim);
                v_session_claim := NULL;
                v_now_ms := p_now_ms + (floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - v_stmt_ms);
                IF v_session_until > v_now_ms AND v_session_owner <> p_owner_id THEN
                    v_left := v_left || v_candidate.session_id;
                    CONTINUE;  -- another owner took it since the scan
                END IF;
                v_is_new := NOT (v_session_until > v_now_ms);
                IF v_is_new AND v_new_sessions >= coalesce(p_max_new_sessions, 0) THEN
                    v_left := v_left || v_candidate.session_id;
                    CONTINUE;
                END IF;
                IF v_session_owner <> p_owner_id THEN
                    -- An expired session of another owner: nothing of it is kept.
                    v_session_until := NULL;
                    v_session_activity := NULL;
                END IF;
            ELSE
                v_is_new := true;
                IF EXISTS (SELECT 1 FROM sessions s WHERE s.session_id = v_candidate.session_id)
                   OR v_new_sessions >= coalesce(p_max_new_sessions, 0) THEN
                    -- The row exists and another transaction holds it, or
                    -- a new session is over the budget.
                    PERFORM pg_advisory_unlock(c_session_claim, v_session_claim);
                    v_session_claim := NULL;
                    v_left := v_left || v_candidate.session_id;
                    CONTINUE;
                END IF;
                -- No row: create it (its lease is written below). Its
                -- insert must hold the claim to the commit (a second
                -- insert would wait on it): the claim is taken again at
                -- transaction level (a session holding a key always gets
                -- it again), one lock per new session, at most
                -- p_max_new_sessions, and the session-level one let go.
                PERFORM pg_advisory_xact_lock(c_session_claim, v_session_claim);
                PERFORM pg_advisory_unlock(c_session_claim, v_session_claim);
                v_session_claim := NULL;
                INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
                VALUES (v_candidate.session_id, p_owner_id, p_now_ms, p_now_ms)
                ON CONFLICT (session_id) DO NOTHING;
                IF NOT FOUND THEN
                    v_left := v_left || v_candidate.session_id;
                    CONTINUE;
                END IF;
                v_session_until := NULL;
                v_session_activity := NULL;
            END IF;

            IF v_is_new THEN
                v_new_sessions := v_new_sessions + 1;
            END IF;
            v_held := v_held || v_candidate.session_id;
            v_held_until := v_held_until || v_session_until;
            v_held_activity := v_held_activity || v_session_activity;
        END IF;

        v_taken := v_taken || v_candidate.id;
    END LOOP;
    EXCEPTION WHEN query_canceled OR others THEN
        IF v_item_claim IS NOT NULL THEN
            PERFORM pg_advisory_unlock(c_item_claim, v_item_claim);
        END IF;
        IF v_session_claim IS NOT NULL THEN
            PERFORM pg_advisory_unlock(c_session_claim, v_session_claim);
        END IF;
        RAISE;
    END;

    IF cardinality(v_taken) = 0 THEN
        RETURN;  -- nothing claimable, or every candidate contended
    END IF;

    -- The leases start now, after every step that could take time: the
    -- caller's clock, or the database's when that is later, by at most
    -- c_lease_bound_ms; plus the timeout.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    v_lease_start := v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms);

    -- A session this owner already held keeps a later expiry and a later
    -- activity stamp than these.
    UPDATE sessions s
       SET worker_id = p_owner_id,
           locked_until = greatest(h.prior_until,
               v_lease_start + coalesce(p_session_lock_timeout_ms, p_lock_timeout_ms)),
           last_activity_at = greatest(h.prior_activity, v_now_ms)
      FROM unnest(v_held, v_held_until, v_held_activity) AS h(held_session, prior_until, prior_activity)
     WHERE s.session_id = h.held_session;

    RETURN QUERY
    WITH leased AS (
        UPDATE worker_queue q
           SET lock_token = 'lock_' || gen_random_uuid()::text,
               locked_until = v_lease_start + p_lock_timeout_ms,
               attempt_count = q.attempt_count + 1
         WHERE q.id = ANY (v_taken)
        RETURNING q.id, q.session_id, q.work_item, q.lock_token, q.attempt_count
    )
    SELECT l.work_item, l.lock_token, l.attempt_count
    FROM leased l
    ORDER BY l.session_id NULLS FIRST, l.id;
END;
$fn$;
        RAISE NOTICE 'restore: fetch_work_items was %; installed the fix of 0035_worker_fetch_leases_bounded_by_the_database_clock.sql', v_plan #>> '{fetch_work_items,definition}';
    END IF;

    -- What upstream changed in a way no fix of the pack serves yet.
    FOR v_row IN SELECT e.key, e.value ->> 'definition' AS definition FROM jsonb_each(v_plan) e WHERE e.value ->> 'action' = 'left' LOOP
        RAISE NOTICE 'restore: % is %, which upstream changed in a way this pack has no fix for yet: left as it is', v_row.key, v_row.definition;
    END LOOP;
END;
$restore$;
-- +goose StatementEnd
