-- 0036_renewals_bounded_by_the_database_clock.sql
-- Fixes: renew_work_item_lock, renew_session_lock, renew_orchestration_item_lock
-- Lease bound: 30000 ms
--
-- Not an upstream migration: this pack's fix of how far the database clock
-- may lengthen a renewed lease. Records nothing in _duroxide_migrations.
--
-- What: redefines the three renewals with the same signatures, return
-- types and bodies as their latest fixes (0026's renew_work_item_lock and
-- renew_session_lock, 0032's renew_orchestration_item_lock); only the
-- new expiry's start changes, as 0034 and 0035 change the fetches'. It runs
-- from the caller's clock carried forward (v_now_ms), and the database
-- clock (v_db_ms) may move it later by at most c_lease_bound_ms (30000 ms,
-- the "Lease bound" line above):
--
--     new expiry = greatest(old expiry,
--                           v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms) + extension)
--
-- Why: 0026 and 0032 extend from greatest(v_now_ms, v_db_ms), so a
-- database clock S ahead of the callers lengthens every renewed lease by
-- S, however large S is: a holder that renews, then crashes, keeps its
-- instance, item or sessions S longer than the extension by the callers'
-- own clocks. With the bound, a lease renewed and then left runs out at
-- most bound + extension after the renewal, by the caller's clock. 0034's
-- header has the bound's grounds (30 s: duroxide-pg's pool acquire
-- timeout; doctor's critical clock skew) and the trade: a caller more than
-- the bound behind the database clock renews from its own clock plus the
-- bound, full by its own clock, short by the database's; doctor's skew and
-- expired-lease findings say why. Below the bound nothing changes.
--
-- Everything else is unchanged: the row locks are taken first and
-- liveness judged after the wait, by the caller's clock carried forward;
-- an expiry already later is kept (never shorter); renew_session_lock
-- locks the owners' sessions in session_id order; renew_work_item_lock
-- stamps the session's activity, never moving it back;
-- renew_orchestration_item_lock reads its lease once through
-- idx_instance_locks_lock_token (0032) and writes its expiry to the
-- claimed messages; bad input is rejected with SQLSTATE 22023.
--
-- Which definitions it replaces: the ones 0026 and 0032 know (upstream's
-- texts, unchanged from its version 14, renew_orchestration_item_lock's
-- from 2, to 23; the pack's texts of them; 0026's and 0032's fixes), or
-- this fix (installed again, no change). Anything else fails with SQLSTATE
-- 55000 naming the function, and nothing is changed.
--
-- Locks: no table lock: it only replaces functions (a call in flight
-- finishes on the old text, the next call uses the new one); no row is read
-- or written.
-- Duration: milliseconds, whatever the tables hold.
--
-- Down identifies the definitions the same way. Over this fix it restores
-- 0026's renew_work_item_lock and renew_session_lock and 0032's
-- renew_orchestration_item_lock (the unbounded extension); any other
-- definition it knows is left as it is; an unknown one is refused.
--
-- Down locks: no table lock: it only replaces functions (a call in flight
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
            ('renew_work_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint'),
            ('renew_session_lock', 'p_owner_ids text[], p_now_ms bigint, p_extend_ms bigint, p_idle_timeout_ms bigint'),
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
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
            RAISE EXCEPTION '0036: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 35 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_work_item_lock', '27842e4207dab97761b627c6adc60eb2', 'upstream 14-23', 19, false),
            ('renew_work_item_lock', 'bc54f4cc7f122821af599e903af36181', 'pack 0014', 19, false),
            ('renew_work_item_lock', '0dcd19d9b355eff3a7768a660a69c500', 'pack 0026 fix', 19, true),
            ('renew_work_item_lock', '1492548829d855cbc0980265cce838ff', 'pack 0036 fix', 19, true),
            ('renew_session_lock', '994b35482168171df72eb10d74abebc5', 'upstream 14-23', 19, false),
            ('renew_session_lock', '87da68ad65c6f445a2e84ed570baaedc', 'pack 0014', 19, false),
            ('renew_session_lock', 'd5c0fd415a52aaac2b7d0b407168181a', 'pack 0026 fix', 19, true),
            ('renew_session_lock', 'a8ff1289c6d43cde73eb8eb8e6546ad5', 'pack 0036 fix', 19, true),
            ('renew_orchestration_item_lock', '3acd62b1a71eb9767e745aa5dcbdaac3', 'upstream 2-23', 19, false),
            ('renew_orchestration_item_lock', '219fa1b144e073a0da0b96b84f176dba', 'pack 0002', 19, false),
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '5cf292d7feecbe4675e1973e117bee76', 'pack 0032 fix', 19, true),
            ('renew_orchestration_item_lock', 'ed37d76d6c56072838feed4d25ab03a4', 'pack 0036 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0036: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0036: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;

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
            ('renew_work_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint'),
            ('renew_session_lock', 'p_owner_ids text[], p_now_ms bigint, p_extend_ms bigint, p_idle_timeout_ms bigint'),
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
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
            RAISE EXCEPTION '0036: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 35 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_work_item_lock', '27842e4207dab97761b627c6adc60eb2', 'upstream 14-23', 19, false),
            ('renew_work_item_lock', 'bc54f4cc7f122821af599e903af36181', 'pack 0014', 19, false),
            ('renew_work_item_lock', '0dcd19d9b355eff3a7768a660a69c500', 'pack 0026 fix', 19, true),
            ('renew_work_item_lock', '1492548829d855cbc0980265cce838ff', 'pack 0036 fix', 19, true),
            ('renew_session_lock', '994b35482168171df72eb10d74abebc5', 'upstream 14-23', 19, false),
            ('renew_session_lock', '87da68ad65c6f445a2e84ed570baaedc', 'pack 0014', 19, false),
            ('renew_session_lock', 'd5c0fd415a52aaac2b7d0b407168181a', 'pack 0026 fix', 19, true),
            ('renew_session_lock', 'a8ff1289c6d43cde73eb8eb8e6546ad5', 'pack 0036 fix', 19, true),
            ('renew_orchestration_item_lock', '3acd62b1a71eb9767e745aa5dcbdaac3', 'upstream 2-23', 19, false),
            ('renew_orchestration_item_lock', '219fa1b144e073a0da0b96b84f176dba', 'pack 0002', 19, false),
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '5cf292d7feecbe4675e1973e117bee76', 'pack 0032 fix', 19, true),
            ('renew_orchestration_item_lock', 'ed37d76d6c56072838feed4d25ab03a4', 'pack 0036 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0036: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_definition = 'pack 0036 fix' THEN
            v_restore := v_restore || v_function.name;
        ELSE
            RAISE NOTICE '0036: % is %, which does not carry this fix: left as it is', v_function.name, v_definition;
        END IF;
    END LOOP;

    IF 'renew_work_item_lock' = ANY (v_restore) THEN
        RAISE NOTICE '0036: renew_work_item_lock was pack 0036 fix; restoring 0026''s fix';
        -- 0026's fix, verbatim from 0026_renewals_extend_after_the_wait.sql.
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

    -- The new expiry: the later of the caller's clock and the database's,
    -- plus the extension; a later expiry already written is kept.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    UPDATE worker_queue
       SET locked_until = greatest(locked_until, greatest(v_now_ms, v_db_ms) + p_extend_secs * 1000)
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
    END IF;

    IF 'renew_session_lock' = ANY (v_restore) THEN
        RAISE NOTICE '0036: renew_session_lock was pack 0036 fix; restoring 0026''s fix';
        -- 0026's fix, verbatim from 0026_renewals_extend_after_the_wait.sql.
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

    -- Extend the live, non-idle ones, judged after the wait: the later of
    -- the caller's clock and the database's, plus the extension; a later
    -- expiry already written (by a fetch) is kept. Renewing is not activity.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    UPDATE sessions
       SET locked_until = greatest(locked_until, greatest(v_now_ms, v_db_ms) + p_extend_ms)
     WHERE session_id = ANY(v_locked)
       AND worker_id = ANY(p_owner_ids)
       AND locked_until > v_now_ms
       AND last_activity_at > v_now_ms - p_idle_timeout_ms;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    RETURN v_row_count;
END;
$fn$;
    END IF;

    IF 'renew_orchestration_item_lock' = ANY (v_restore) THEN
        RAISE NOTICE '0036: renew_orchestration_item_lock was pack 0036 fix; restoring 0032''s fix';
        -- 0032's fix, verbatim from 0032_renewal_reads_its_lease_by_token.sql.
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
    END IF;
END;
$undo$;
-- +goose StatementEnd
