-- 0032_renewal_reads_its_lease_by_token.sql
-- Fixes: renew_orchestration_item_lock
-- Adds: index idx_instance_locks_lock_token
--
-- Not an upstream migration: this pack's fix of the cost of
-- renew_orchestration_item_lock (0026's fix). Records nothing in
-- _duroxide_migrations.
--
-- What: an index of instance_locks by lock_token, and
-- renew_orchestration_item_lock redefined with the same signature and the
-- same results as 0026's fix, reading its lease row once (locked, through
-- the index) and writing it by its primary key.
--
-- Why: upstream's catalog has no index on instance_locks.lock_token, and
-- every call that names an orchestration lease by its token reads the
-- whole table: the renewal, the ack's lease check (0021), the abandon.
-- The table holds one row per instance ever leased and not yet acked, so
-- the cost of a renewal grows with the other instances' leases: with
-- 100,000 leased instances, upstream's renewal read 100,001 rows a call
-- (4-5 ms), and 0026's, which reads the row twice (once to lock it, once
-- to update it), 200,001 (9-10 ms; docs/bench/plans.md). With the index
-- each of these calls reads the rows of its own token.
--
-- What it costs: one more index entry for each lease a fetch takes (a new
-- lock row, or a lock row whose token the fetch replaces; the row's
-- locked_until is already in an index, so neither write was a HOT update
-- before). docs/BENCH.md has the per-call cost against upstream's.
--
-- Which definition it replaces: 0026's fix, or this fix (installed
-- again); anything else fails with SQLSTATE 55000 naming the function,
-- and nothing is changed.
--
-- Locks: SHARE on instance_locks, to commit, while the index is built
-- (CREATE INDEX, in the transaction that installs the renewal reading it):
-- the fetches, acks, renewals and abandons of orchestrations, which write
-- lock rows, wait for the build; reads go on. No writer of either queue
-- waits: enqueue_orchestrator_work, enqueue_worker_work and the worker
-- queue's fetch and ack never touch instance_locks. A build that holds
-- writers is fine here, where it would not be on a queue: instance_locks
-- is no backlog, it holds a row per instance under a lease (and per
-- instance whose lease ran out before its ack, until its next fetch), so
-- the build's time grows with the instances the dispatchers hold at once,
-- not with the messages or work items queued.
-- Duration: proportional to the rows of instance_locks (the leases held at
-- once, not the queues' backlog); milliseconds for thousands of leases.
--
-- Down restores 0026's fix and drops the index, refusing an unknown
-- definition as the Up.
--
-- Down locks: ACCESS EXCLUSIVE on instance_locks, to commit (DROP INDEX
-- idx_instance_locks_lock_token): it waits for every transaction that has read
-- or written the leases to end, and the orchestration fetches, acks, renewals
-- and abandons that come after it wait behind it; it also replaces a function.
-- Down duration: milliseconds, whatever instance_locks holds: dropping an
-- index reads no row.

-- squawk-ignore-file require-concurrent-index-creation, require-concurrent-index-deletion -- instance_locks holds one row per live or abandoned lease, so its build is short, and a build CONCURRENTLY cannot run in the transaction that makes the index and the function that reads it appear together

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
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
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
            RAISE EXCEPTION '0032: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 26 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '5cf292d7feecbe4675e1973e117bee76', 'pack 0032 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0032: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0032: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

CREATE INDEX idx_instance_locks_lock_token ON instance_locks (lock_token);

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION renew_orchestration_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Longest extension accepted: one day.
    c_max_extend_secs CONSTANT bigint := 86400;

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

    -- The new expiry: the later of the caller's clock and the database's,
    -- plus the extension; a later expiry already written is kept.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    IF v_instance_id IS NULL OR v_locked_until <= v_now_ms THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already released';
    END IF;
    v_locked_until := greatest(v_locked_until, greatest(v_now_ms, v_db_ms) + p_extend_secs * 1000);

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
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
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
            RAISE EXCEPTION '0032: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 26 or later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '5cf292d7feecbe4675e1973e117bee76', 'pack 0032 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0032: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0032: % was %; restoring 0026''s fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Restore 0026's fix, verbatim from 0026_renewals_extend_after_the_wait.sql.
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION renew_orchestration_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    -- Longest extension accepted: one day.
    c_max_extend_secs CONSTANT bigint := 86400;

    v_stmt_ms bigint;     -- database clock when the statement started
    v_now_ms bigint;      -- the caller's clock, carried forward
    v_db_ms bigint;
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

    -- Lock the lease row first. This can wait (an ack in flight holds it
    -- from its lease check on); everything below is decided after the
    -- wait, against the newest row.
    PERFORM 1 FROM instance_locks l WHERE l.lock_token = p_lock_token FOR UPDATE;

    -- The new expiry: the later of the caller's clock and the database's,
    -- plus the extension; a later expiry already written is kept.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    UPDATE instance_locks l
       SET locked_until = greatest(l.locked_until, greatest(v_now_ms, v_db_ms) + p_extend_secs * 1000)
     WHERE l.lock_token = p_lock_token
       AND l.locked_until > v_now_ms
    RETURNING l.locked_until INTO v_locked_until;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already released';
    END IF;

    -- The claimed messages carry the lease's expiry.
    UPDATE orchestrator_queue q
       SET locked_until = v_locked_until
     WHERE q.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd

DROP INDEX IF EXISTS idx_instance_locks_lock_token;
