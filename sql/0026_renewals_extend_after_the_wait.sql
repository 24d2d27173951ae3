-- 0026_renewals_extend_after_the_wait.sql
-- Fixes: renew_work_item_lock, renew_session_lock, renew_orchestration_item_lock
--
-- Not an upstream migration: this pack's fix of the three lease renewals
-- (0025's audit found them). Records nothing in _duroxide_migrations.
--
-- What: redefines the three functions with the same signatures and return
-- types. With nothing contending, and an extension that lengthens the
-- lease, they give the same results as at 19 (only the expiry times
-- differ).
--
-- Why: at version 19 (unchanged by upstream up to 23) each renewal computes
-- its new expiry, p_now_ms plus the extension, before its UPDATE, which can
-- wait on the row (an ack or abandon of the same token, a fetch re-claiming
-- a lease it judged expired, 0021's ack holding its lease row, a session
-- fetch or activity stamp). After a wait of W ms the expiry written is
-- short by W, and a lease that expired during the wait is still renewed by
-- the stale p_now_ms. The new expiry also replaces the old one outright: a
-- renewal can shorten a lease, and renew_session_lock can shorten the
-- expiry a concurrent fetch just set. duroxide-pg sends
-- renew_work_item_lock's and renew_orchestration_item_lock's extension in
-- whole seconds, truncated: an extension under one second is 0, which at 19
-- ends the lease at once.
--
-- The fix, for each renewal:
--   * Lock first, decide after. The rows are locked (FOR UPDATE; a renewal
--     targets its own token or owner, so it waits on no shared candidate),
--     and only then are liveness and idleness judged, by the caller's clock
--     carried forward (p_now_ms plus the time elapsed since the statement
--     started), as in 0020 and 0025. A lease that expired while the call
--     waited is refused ('Lock token invalid, ...' as before) or, for
--     sessions, not renewed.
--   * The new expiry is the later of that caller-clock now and the database
--     clock, plus the extension; an expiry already later is kept (never
--     shorter). renew_orchestration_item_lock writes the lease's resulting
--     expiry to its claimed messages.
--   * renew_session_lock locks the owners' live sessions in session_id
--     order, so two renewals of overlapping owners cannot deadlock.
--   * renew_work_item_lock stamps the session's last_activity_at after the
--     wait for that row, never moving it back.
--   * Bad input is rejected with SQLSTATE 22023 naming the parameter:
--     p_now_ms NULL or negative; an extension NULL, negative or above one
--     day; p_idle_timeout_ms NULL or negative. NULL or empty p_owner_ids
--     still renews nothing (0).
--
-- Which renewals it fixes. Upstream's texts are unchanged from its version
-- 14 (renew_orchestration_item_lock from 2) to 23, so one fixed definition
-- each serves every database from 19 on. The guard identifies each
-- installed definition by its fingerprint: upstream's text, the pack's, or
-- this fix (installed again, no change); anything else fails with SQLSTATE
-- 55000 naming the function, and nothing is changed.
--
-- Down identifies the definitions the same way and restores version 19's
-- (the pack's texts, behaviourally identical to upstream's); it refuses an
-- unknown one.
--
-- Locks: no table lock: it only replaces functions (a call in flight finishes
-- on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only replaces functions (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

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
            ('renew_work_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint'),
            ('renew_session_lock', 'p_owner_ids text[], p_now_ms bigint, p_extend_ms bigint, p_idle_timeout_ms bigint'),
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0026: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_work_item_lock', '27842e4207dab97761b627c6adc60eb2', 'upstream 14-23', 19, false),
            ('renew_work_item_lock', 'bc54f4cc7f122821af599e903af36181', 'pack 0014', 19, false),
            ('renew_work_item_lock', '0dcd19d9b355eff3a7768a660a69c500', 'pack 0026 fix', 19, true),
            ('renew_session_lock', '994b35482168171df72eb10d74abebc5', 'upstream 14-23', 19, false),
            ('renew_session_lock', '87da68ad65c6f445a2e84ed570baaedc', 'pack 0014', 19, false),
            ('renew_session_lock', 'd5c0fd415a52aaac2b7d0b407168181a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '3acd62b1a71eb9767e745aa5dcbdaac3', 'upstream 2-23', 19, false),
            ('renew_orchestration_item_lock', '219fa1b144e073a0da0b96b84f176dba', 'pack 0002', 19, false),
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0026: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0026: % was %; installing the fix', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- +goose StatementBegin
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
-- +goose StatementEnd

-- +goose StatementBegin
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
-- +goose StatementEnd

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
            ('renew_work_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint'),
            ('renew_session_lock', 'p_owner_ids text[], p_now_ms bigint, p_extend_ms bigint, p_idle_timeout_ms bigint'),
            ('renew_orchestration_item_lock', 'p_lock_token text, p_now_ms bigint, p_extend_secs bigint')
        ) AS f(name, arguments)
    LOOP
        SELECT md5(p.prosrc), md5(replace(p.prosrc, n.nspname || '.', '@schema@.'))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND THEN
            RAISE EXCEPTION '0026: schema % has no %(%); nothing was changed', current_schema(), v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to duroxide-pg schema version 19 and later.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('renew_work_item_lock', '27842e4207dab97761b627c6adc60eb2', 'upstream 14-23', 19, false),
            ('renew_work_item_lock', 'bc54f4cc7f122821af599e903af36181', 'pack 0014', 19, false),
            ('renew_work_item_lock', '0dcd19d9b355eff3a7768a660a69c500', 'pack 0026 fix', 19, true),
            ('renew_session_lock', '994b35482168171df72eb10d74abebc5', 'upstream 14-23', 19, false),
            ('renew_session_lock', '87da68ad65c6f445a2e84ed570baaedc', 'pack 0014', 19, false),
            ('renew_session_lock', 'd5c0fd415a52aaac2b7d0b407168181a', 'pack 0026 fix', 19, true),
            ('renew_orchestration_item_lock', '3acd62b1a71eb9767e745aa5dcbdaac3', 'upstream 2-23', 19, false),
            ('renew_orchestration_item_lock', '219fa1b144e073a0da0b96b84f176dba', 'pack 0002', 19, false),
            ('renew_orchestration_item_lock', '686960e405a96482486b8a040d104a6a', 'pack 0026 fix', 19, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0026: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0026: % was %; restoring version 19''s definition', v_function.name, v_definition;
    END LOOP;
END;
$guard$;
-- +goose StatementEnd

-- Restore version 19's definitions, verbatim from 0014_add_session_support.sql
-- (the two worker renewals) and 0002_create_stored_procedures.sql.
-- +goose StatementBegin
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
    v_locked_until bigint := p_now_ms + p_extend_secs * 1000;
    v_session_id text;
    v_row_count bigint;
BEGIN
    SELECT session_id INTO v_session_id
    FROM worker_queue
    WHERE lock_token = p_lock_token;

    -- Replaces the expiry (may shorten it); only a live lease is renewed.
    UPDATE worker_queue
    SET locked_until = v_locked_until
    WHERE lock_token = p_lock_token
      AND locked_until > p_now_ms;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    IF v_row_count = 0 THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already acked';
    END IF;

    -- Session piggy-back: stamp activity on a still-live session (no
    -- owner check, locked_until unchanged).
    IF v_session_id IS NOT NULL THEN
        UPDATE sessions
        SET last_activity_at = p_now_ms
        WHERE session_id = v_session_id
          AND locked_until > p_now_ms;
    END IF;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
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
    v_row_count bigint;
BEGIN
    -- Extend the live, non-idle sessions of the given owners. The new
    -- expiry replaces the old one; renewing is not activity.
    UPDATE sessions
    SET locked_until = p_now_ms + p_extend_ms
    WHERE worker_id = ANY(p_owner_ids)
      AND locked_until > p_now_ms
      AND last_activity_at > p_now_ms - p_idle_timeout_ms;

    GET DIAGNOSTICS v_row_count = ROW_COUNT;
    RETURN v_row_count;
END;
$fn$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION renew_orchestration_item_lock(p_lock_token text, p_now_ms bigint, p_extend_secs bigint)
RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $fn$
DECLARE
    v_locked_until bigint := p_now_ms + p_extend_secs * 1000;
BEGIN
    -- The extension is in seconds and replaces the old expiry outright (it
    -- can shorten the lease); only a live lease can be renewed.
    UPDATE instance_locks l
    SET locked_until = v_locked_until
    WHERE l.lock_token = p_lock_token
      AND l.locked_until > p_now_ms;

    IF NOT FOUND THEN
        RAISE EXCEPTION 'Lock token invalid, expired, or already released';
    END IF;

    UPDATE orchestrator_queue q
    SET locked_until = v_locked_until
    WHERE q.lock_token = p_lock_token;
END;
$fn$;
-- +goose StatementEnd
