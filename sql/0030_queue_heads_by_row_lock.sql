-- 0030_queue_heads_by_row_lock.sql
-- Fixes: orchestrator_queue_head_offer, orchestrator_queue_head_refresh, orchestrator_queue_heads_after_delete
--
-- Not an upstream migration: this pack's fix of the queue heads' upkeep
-- (0027, keys scoped by 0029). Records nothing in _duroxide_migrations.
--
-- What: redefines the two helpers the heads' triggers and the fetch call,
-- with the same signatures and the same guarantee: a head is never late or
-- missing while its instance has a queued message, whoever writes the
-- queue, under concurrent writers in READ COMMITTED. Only the lock that
-- gives the guarantee changes: the instance's head row itself, where 0027
-- and 0029 took an advisory key per instance.
--
-- Why: an advisory lock is an entry in the server's shared lock table,
-- held to the end of the transaction. Every message queued took its
-- instance's key shared, and every head brought up to date took it
-- exclusively, so one transaction that queued or deleted messages of many
-- instances held one entry per instance: an INSERT of 30,000 orchestrator
-- messages for distinct instances, a DELETE of the queue, or
-- delete_instances_atomic over that many running instances failed with
-- "out of shared memory" (SQLSTATE 53200) on a server with PostgreSQL's
-- default max_connections (100) and max_locks_per_transaction (64): a
-- table of 6,400 entries, shared by every session, so other sessions
-- failed too while it was full. Upstream's schema takes no lock per
-- message and does the same at 100,000. A row lock is written in the row
-- (its xmax, a MultiXact when several transactions share it) and takes no
-- entry in the lock table, however many rows a transaction locks.
--
-- The protocol, 0027's with the row in place of the key:
--   * an offer (every inserted message; a visible_at moved earlier) reads
--     its instance's head FOR KEY SHARE; when the message is not older
--     than the head that is all it does, so offers of one instance (the
--     activity completions of a fan-in) never wait on each other; when it
--     is the instance's first or older than its head, it inserts or lowers
--     the head (INSERT ... ON CONFLICT DO UPDATE, which locks the row it
--     conflicts with even when it leaves it unchanged). Either way the
--     transaction holds a lock on the head row until it ends.
--   * a refresh (after the message a head names is deleted, and in the
--     fetch) locks the head row FOR UPDATE SKIP LOCKED: when an offer's
--     transaction holds it, the head is left early; otherwise a new
--     statement reads the instance's oldest message and moves the head to
--     it or deletes it, and a new offer waits for the refresh's
--     transaction, then reads the row as it was left (READ COMMITTED
--     re-reads a row it waited for). A refresh never waits, and never
--     creates a head: a head it cannot lock or does not find stays as it
--     is.
--   * FOR KEY SHARE conflicts with FOR UPDATE and DELETE only, not with
--     the UPDATE of visible_at and id (not key columns): an offer that
--     lowers a head does not hold up offers behind it.
--   * Writers under REPEATABLE READ or SERIALIZABLE are not covered, as at
--     0027: duroxide-pg runs its calls in READ COMMITTED, the default.
--
-- Plans: the helpers and the delete trigger run with enable_seqscan off
-- (a SET clause of the function, nothing else sees it). Each of their
-- statements reads one instance's rows by an index (the heads' primary
-- key, idx_orch_instance_head); a plan made while the table is empty (after
-- a TRUNCATE, or with an idle system's statistics) is a sequential scan,
-- and PL/pgSQL keeps it for the rest of the session or of a bulk
-- statement's rows: one INSERT of 100,000 messages after a TRUNCATE read
-- the heads table 100,000 times over (5 billion rows, stopped after ten
-- minutes, at 0029 and at this fix without the setting); with it, 2.2 s.
-- The delete trigger also runs with enable_indexonlyscan off, and reads
-- the head by its primary key alone: idx_orch_heads_order (visible_at, id)
-- INCLUDE (instance_id) covers every column of the table, and planned on
-- an empty table its lookup was an index-only scan of that whole index for
-- every deleted message (a DELETE of 100,000 messages did not end in 30 s;
-- with the change, about 2 s).
--
-- What it costs: a row lock writes the row's header (a WAL record) where
-- the advisory key lived in memory; each message queued behind an existing
-- head pays that instead of a lock-table entry. docs/BENCH.md has the cost
-- per call both ways, and per row in bulk.
--
-- Which definitions it replaces: 0027's or 0029's helpers and 0027's
-- delete trigger, or this fix (installed again); anything else fails with SQLSTATE 55000 naming the
-- function, and nothing is changed.
--
-- Locks: EXCLUSIVE on orchestrator_queue from the guard to the commit: it
-- waits for the transactions that write or row-lock the queue (each holds
-- advisory keys under the old protocol) and keeps new ones out while the
-- two helpers are replaced; milliseconds on an idle queue, whatever its
-- size (no row is read or written). Plain reads go on.
-- Duration: milliseconds, whatever the queue holds, once the transactions
-- it waits for have ended.
--
-- Down restores 0029's helpers and 0027's delete trigger over any
-- definition the Up knows, under the same lock, and refuses an unknown one.
--
-- Down locks: EXCLUSIVE on orchestrator_queue from the LOCK TABLE to the
-- commit, as the Up: it waits for the transactions that write or row-lock the
-- queue, then keeps new ones out while the helpers and the delete trigger's
-- function are replaced; plain reads go on; no row is read or written.
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
            ('orchestrator_queue_head_offer', 'p_instance_id text, p_visible_at timestamp with time zone, p_id bigint'),
            ('orchestrator_queue_head_refresh', 'p_instance_id text'),
            ('orchestrator_queue_heads_after_delete', '')
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
            RAISE EXCEPTION '0030: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 27 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('orchestrator_queue_head_offer', '9cb80919ffdf6069330de6f0c6ceabe7', 'pack 0027', 19, false),
            ('orchestrator_queue_head_offer', 'f69fbcf54821dee749cd677cd5780ecf', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_offer', 'fea1358d03c8230beee9491765797530', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_head_refresh', '39d0dff9387cd85c779aeef064c65a7b', 'pack 0027', 19, false),
            ('orchestrator_queue_head_refresh', '133574bbb15415b60288aff0632713cb', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_refresh', '3990bdc538349ce8bc5a2792640abd5e', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_heads_after_delete', '7ef866ec6daf067f23785aa8949801b6', 'pack 0027', 19, false),
            ('orchestrator_queue_heads_after_delete', '2cb700ddb12dc3edfe73edbb7d130bf8', 'pack 0030 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0030: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0030: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Wait for every transaction that writes or row-locks the queue, and keep
-- new ones out until this transaction commits, so that no transaction
-- relies on one protocol while another follows the other. Plain reads go
-- on.
LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;

-- Offer message (p_visible_at, p_id) of p_instance_id as its head: after
-- it, the head is no later than the message, and no refresh can move it
-- past the message before this transaction ends.
-- +goose StatementBegin
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

-- The delete trigger: after the message its instance's head names is
-- deleted, bring the head up to date (deleting any other message cannot
-- make a head late).
-- +goose StatementBegin
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
            ('orchestrator_queue_head_offer', 'p_instance_id text, p_visible_at timestamp with time zone, p_id bigint'),
            ('orchestrator_queue_head_refresh', 'p_instance_id text'),
            ('orchestrator_queue_heads_after_delete', '')
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
            RAISE EXCEPTION '0030: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 27 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('orchestrator_queue_head_offer', '9cb80919ffdf6069330de6f0c6ceabe7', 'pack 0027', 19, false),
            ('orchestrator_queue_head_offer', 'f69fbcf54821dee749cd677cd5780ecf', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_offer', 'fea1358d03c8230beee9491765797530', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_head_refresh', '39d0dff9387cd85c779aeef064c65a7b', 'pack 0027', 19, false),
            ('orchestrator_queue_head_refresh', '133574bbb15415b60288aff0632713cb', 'pack 0029 fix', 19, true),
            ('orchestrator_queue_head_refresh', '3990bdc538349ce8bc5a2792640abd5e', 'pack 0030 fix', 19, true),
            ('orchestrator_queue_heads_after_delete', '7ef866ec6daf067f23785aa8949801b6', 'pack 0027', 19, false),
            ('orchestrator_queue_heads_after_delete', '2cb700ddb12dc3edfe73edbb7d130bf8', 'pack 0030 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0030: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0030: % was %; restoring 0029''s definition', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Wait for every transaction that writes or row-locks the queue, and keep
-- new ones out until this transaction commits, so that no transaction
-- relies on one protocol while another follows the other. Plain reads go
-- on.
LOCK TABLE orchestrator_queue IN EXCLUSIVE MODE;

-- Restore 0029's definitions, verbatim from 0029_schema_scoped_instance_keys.sql.
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

-- Restore 0027's delete trigger, verbatim from 0027_fetch_by_instance_head.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION orchestrator_queue_heads_after_delete()
RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
BEGIN
    PERFORM 1 FROM orchestrator_queue_heads h
    WHERE h.instance_id = OLD.instance_id AND h.id = OLD.id;
    IF FOUND THEN
        PERFORM orchestrator_queue_head_refresh(OLD.instance_id);
    END IF;
    RETURN NULL;
END;
$fn$;
-- +goose StatementEnd
