-- 0021_ack_locks_its_lease.sql
-- Fixes: ack_orchestration_item
--
-- Not an upstream migration: this pack's second fix, to ack_orchestration_item
-- (same signature, same results). Like 0020 it records nothing in
-- _duroxide_migrations.
--
-- What: step 1 of the ack, the check that the lease (instance_locks row of
-- the token) exists and is still live, now locks that row (FOR UPDATE) until
-- the ack commits. Nothing else changes.
--
-- Why: at version 19 the check is a plain read. An ack that passed it while
-- its lease was about to expire could be overtaken before it deleted its
-- batch: a fetch whose clock says the lease is over takes the instance lock
-- and re-claims the same messages under its own token; the ack then deletes
-- nothing (the rows carry the new token), commits anyway, and the new holder
-- processes the same messages again: a turn applied twice. With the row
-- locked, 0020's fetch skips the instance (it locks instance_locks with SKIP
-- LOCKED) and 0019's fetch waits for the ack and then sees the lease gone.
-- An ack that arrives after a takeover still fails with 'Invalid lock token'
-- (under READ COMMITTED the locked re-check sees the new token).
--
-- Cost: one row lock, on a row the ack deletes anyway at its end.
--
-- Which ack it fixes. Upstream changed the ack in its version 20 (KV
-- mutations go to kv_delta, folded into kv_store on a terminal turn), and
-- duroxide-pg's own runner applies that version to every database it opens
-- (releases 0.1.27 and later), before or after this pack. So this migration
-- first identifies the installed definition by its fingerprint (the md5 of
-- its source, the schema's name replaced by @schema@, as
-- the fingerprint package of the harness computes it), against upstream's own texts and
-- the pack's, and installs the fixed definition for that behaviour:
--   * upstream 19 behaviour (kv_store): version 19's ack with the lock;
--   * upstream 20 behaviour (kv_delta, unchanged in 21 and 23): version 20's
--     ack with the lock;
--   * upstream 24 behaviour, the continued-as-new ack of upstream's branch
--     file 0024_continue_as_new_completed_at.sql (unreleased; its number
--     collides with upstream's candidate fix of the fetch, which does not
--     touch the ack): version 20's ack, except that ContinuedAsNew, like
--     Completed and Failed, sets completed_at to the call's timestamp. That
--     file leaves the lease check a plain read; this installs it with the
--     lock, and keeps the completion time (and the completion times the
--     file backfilled: no row is touched here).
-- An already fixed ack is installed again (no change). A definition it does
-- not know (a hand edit, a newer upstream) makes it fail with SQLSTATE 55000
-- naming the function, and the transaction changes nothing. Running this Up
-- again after duroxide-pg's runner replaced the fix puts the fix back for
-- whichever of these behaviours the runner installed.
--
-- Down identifies the definition the same way and restores, for a fixed
-- ack, the pack's unfixed definition of the same behaviour (19's, 20's or
-- the continued-as-new one), behaviourally identical to upstream's. An ack
-- that does not carry the fix (duroxide-pg's runner replaced it) is left as
-- it is: there is nothing of this migration's to undo, and replacing it
-- would undo upstream's change.
-- Full bodies per behaviour, not an edit of the installed text: each body
-- here can be reviewed and tested on its own, and the restored definition
-- is a known one whatever text was installed before.
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
    v_fixed boolean;
BEGIN
    SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'ack_orchestration_item'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_lock_token text, p_now_ms bigint, p_execution_id bigint, p_history_delta jsonb, p_worker_items jsonb, p_orchestrator_items jsonb, p_metadata jsonb, p_cancelled_activities jsonb';
    IF NOT FOUND THEN
        RAISE EXCEPTION '0021: schema % has no ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb); nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as, k.fixed INTO v_definition, v_behaves_as, v_fixed
    FROM (VALUES
        ('ack_orchestration_item', '6b8f539683584a7bf3e4243e9eb0786d', 'upstream 19', 19, false),
        ('ack_orchestration_item', 'a7c0bb8c647b78f93b54b6eeeb521ed5', 'pack, as upstream 19', 19, false),
        ('ack_orchestration_item', '9be703b17c70bdc077304f9825055125', 'pack 0021 fix, upstream 19 behaviour', 19, true),
        ('ack_orchestration_item', 'e09b0488b13cba5e43fbfa4cdf1bac38', 'upstream 20-23', 20, false),
        ('ack_orchestration_item', '3b21e6c1421d03f64a4c2de5c443e127', 'pack, as upstream 20', 20, false),
        ('ack_orchestration_item', '1590e0fdb3965a379efa3aea63ee71cd', 'pack 0021 fix, upstream 20 behaviour', 20, true),
        ('ack_orchestration_item', 'abb583bcc970d11b3ecbb85eef1f464a', 'upstream branch 0024 continued-as-new ack, port', 24, false),
        ('ack_orchestration_item', '6cf0a7cfb3342824aba0d7a701dc4659', 'pack, as upstream 24', 24, false),
        ('ack_orchestration_item', '3c40c93291f39a183831b567442fecd2', 'pack 0021 fix, upstream 24 behaviour', 24, true)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0021: ack_orchestration_item in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;

    RAISE NOTICE '0021: ack_orchestration_item was %; installing the fix for upstream % behaviour', v_definition, v_behaves_as;
    IF v_behaves_as = 19 THEN
-- Behaviour: upstream 19
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
    ELSIF v_behaves_as = 20 THEN
-- Behaviour: upstream 20
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
    ELSIF v_behaves_as = 24 THEN
-- Behaviour: upstream 24
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
    END IF;
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
    v_fixed boolean;
BEGIN
    SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'ack_orchestration_item'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_lock_token text, p_now_ms bigint, p_execution_id bigint, p_history_delta jsonb, p_worker_items jsonb, p_orchestrator_items jsonb, p_metadata jsonb, p_cancelled_activities jsonb';
    IF NOT FOUND THEN
        RAISE EXCEPTION '0021: schema % has no ack_orchestration_item(text, bigint, bigint, jsonb, jsonb, jsonb, jsonb, jsonb); nothing was changed', current_schema()
            USING ERRCODE = '55000',
                  HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as, k.fixed INTO v_definition, v_behaves_as, v_fixed
    FROM (VALUES
        ('ack_orchestration_item', '6b8f539683584a7bf3e4243e9eb0786d', 'upstream 19', 19, false),
        ('ack_orchestration_item', 'a7c0bb8c647b78f93b54b6eeeb521ed5', 'pack, as upstream 19', 19, false),
        ('ack_orchestration_item', '9be703b17c70bdc077304f9825055125', 'pack 0021 fix, upstream 19 behaviour', 19, true),
        ('ack_orchestration_item', 'e09b0488b13cba5e43fbfa4cdf1bac38', 'upstream 20-23', 20, false),
        ('ack_orchestration_item', '3b21e6c1421d03f64a4c2de5c443e127', 'pack, as upstream 20', 20, false),
        ('ack_orchestration_item', '1590e0fdb3965a379efa3aea63ee71cd', 'pack 0021 fix, upstream 20 behaviour', 20, true),
        ('ack_orchestration_item', 'abb583bcc970d11b3ecbb85eef1f464a', 'upstream branch 0024 continued-as-new ack, port', 24, false),
        ('ack_orchestration_item', '6cf0a7cfb3342824aba0d7a701dc4659', 'pack, as upstream 24', 24, false),
        ('ack_orchestration_item', '3c40c93291f39a183831b567442fecd2', 'pack 0021 fix, upstream 24 behaviour', 24, true)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0021: ack_orchestration_item in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;

    IF NOT v_fixed THEN
        RAISE NOTICE '0021: ack_orchestration_item is %, which does not carry the fix: left as it is', v_definition;
    ELSIF v_behaves_as = 19 THEN
        RAISE NOTICE '0021: ack_orchestration_item was %; restoring version 19''s definition', v_definition;
        -- Version 19's definition, verbatim from 0019_add_kv_last_updated.sql.
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
    -- 1. The lease must exist and still be live.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

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
    ELSIF v_behaves_as = 20 THEN
        RAISE NOTICE '0021: ack_orchestration_item was %; restoring version 20''s definition', v_definition;
        -- Version 20's definition: the fix above without its lock.
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
    -- 1. The lease must exist and still be live.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

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
    ELSIF v_behaves_as = 24 THEN
        RAISE NOTICE '0021: ack_orchestration_item was %; restoring the pack''s continued-as-new ack (upstream 24 behaviour) without the lock', v_definition;
        -- The pack's continued-as-new ack (the behaviour of upstream's branch
        -- 0024): the Up's fix of it without its lock.
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
    -- 1. The lease must exist and still be live.
    SELECT l.instance_id INTO v_instance_id
    FROM instance_locks l
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

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
    END IF;
END;
$undo$;
-- +goose StatementEnd
