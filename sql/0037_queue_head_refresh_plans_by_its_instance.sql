-- 0037_queue_head_refresh_plans_by_its_instance.sql
-- Fixes: orchestrator_queue_head_refresh
--
-- Not an upstream migration: this pack's fix of a plan of the queue heads'
-- upkeep (0030's refresh). Records nothing in _duroxide_migrations.
--
-- What: orchestrator_queue_head_refresh redefined with the same signature,
-- body and guarantee as 0030's, planned with enable_sort and
-- enable_incremental_sort off as well as enable_seqscan (SET clauses of
-- the function: nothing else sees them).
--
-- Why: the refresh reads an instance's oldest message, ORDER BY
-- visible_at, id LIMIT 1. Its good plan is idx_orch_instance_head's
-- ordered scan of the instance's rows. Statistics that say the queue is
-- empty while it is not (an ANALYZE, by autovacuum or a DBA, between a
-- bulk delete and the next bulk queueing: no live row, pages left) cost
-- every plan at a row or so, and PostgreSQL 14 then chose a scan of the
-- whole idx_orch_visible (visible_at, lock_token), filtered by instance
-- and sorted, which gives visible_at's order too: every refresh read every
-- message of the queue. A DBA's DELETE of 100,000 messages ran 2 to 3 s
-- as a rule and, planned so, more than 120 s (CI's PostgreSQL 14 matrix;
-- auto_explain showed the plan). With sorts off, the one plan without a
-- sort, idx_orch_instance_head's ordered scan, is the one chosen, whatever
-- the statistics: no other index gives (visible_at, id) within an
-- instance. The refresh's other statements read the heads table by its
-- primary key and row-lock what they read (a row lock rules out an
-- index-only scan of idx_orch_heads_order, the one other index that could
-- answer them), so they keep 0030's plans.
--
-- What it costs: two more settings saved and restored on each call of the
-- refresh (a message deleted or moved that its instance's head names);
-- docs/BENCH.md has the per-call cost against upstream's.
--
-- Which definition it replaces: 0030's fix, or this fix (installed
-- again); anything else fails with SQLSTATE 55000 naming the function,
-- and nothing is changed.
--
-- Locks: no table lock. CREATE OR REPLACE FUNCTION updates the
-- function's catalog row; a transaction that called the old definition
-- keeps it until it ends, and both keep the same protocol (0030's row
-- lock on the head), so writers of the queue may mix them.
-- Duration: milliseconds, whatever the queue holds.
--
-- Down restores 0030's fix, refusing an unknown definition as the Up.
--
-- Down locks: no table lock, as the Up: it replaces a function.
-- Down duration: milliseconds, whatever the queue holds.

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
            RAISE EXCEPTION '0037: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 30 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('orchestrator_queue_head_refresh', '3990bdc538349ce8bc5a2792640abd5e', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_head_refresh', '6cd2781ed00a3dc44f2d5a0fc285bbd5', 'pack 0037 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0037: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a pack newer than this one. `harness doctor` shows what is installed.';
        END IF;
        RAISE NOTICE '0037: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Bring the head of p_instance_id up to date, unless a transaction that
-- offered a message of the instance is still open (then the head stays
-- early, which is safe): never waits.
-- +goose StatementBegin
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
            RAISE EXCEPTION '0037: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 30 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('orchestrator_queue_head_refresh', '3990bdc538349ce8bc5a2792640abd5e', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_head_refresh', '6cd2781ed00a3dc44f2d5a0fc285bbd5', 'pack 0037 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0037: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a pack newer than this one. `harness doctor` shows what is installed.';
        END IF;
        RAISE NOTICE '0037: % was %; restoring 0030''s fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- 0030's refresh, as 0030 installs it.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_head_refresh(p_instance_id text)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $fn$
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
-- +goose StatementEnd
