-- 0033_worker_batch_fetch_lease_valid_at_return.sql
-- Fixes: fetch_work_items
--
-- Not an upstream migration: this pack's fix of the batched worker fetch
-- that upstream has on a branch. Records nothing in _duroxide_migrations.
--
-- What: where the schema has fetch_work_items (upstream's branch file
-- 0022_add_batched_worker_fetch.sql, unreleased, installs it with four
-- partial indexes on worker_queue), redefines it with the same signature,
-- argument defaults and RETURNS TABLE, and the same batch semantics:
-- it refuses to run unless the transaction is read committed; it returns
-- no row for p_max_items <= 0 or tag mode 'none'; it reads at
-- most LEAST(GREATEST(p_max_items * 4, p_max_items), 1024) candidates,
-- ORDER BY session_id NULLS FIRST, id, eligible as fetch_work_item's
-- (tag modes, sessions: items without a session, items of a session this
-- owner holds, items of a session nobody holds; none bound to a session
-- without an owner); it takes at most p_max_items of them and claims at
-- most p_max_new_sessions sessions this owner does not hold yet; each item
-- taken gets its own token ('lock_' and a UUID) and attempt_count + 1; the
-- rows come back in candidate order. Where the schema has no
-- fetch_work_items (no duroxide-pg release has shipped it; every pack-built
-- schema), the Up does nothing.
--
-- Why: upstream's function repeats, in the worker's batch, the defects the
-- pack fixed in fetch_work_item (0025, 0028):
--   1. every lease is p_now_ms + p_lock_timeout_ms, p_now_ms minted by the
--      caller before the call (duroxide-pg mints it before it waits for a
--      pooled connection). Measured on upstream's text and on its port,
--      p_now_ms 10 s stale, 5 s lock timeout: the lease ends 5 s before the
--      database clock at return, dead on arrival; the activity's ack_worker
--      is refused and the item runs again;
--   2. its session insert-or-update waits on any transaction holding or
--      inserting that session's row (another fetch, a renewal, an activity
--      stamp, a cleanup), with the item rows it already locked held all
--      the while, and the leases already written from the stale clock;
--   3. its candidate scan locks rows with FOR UPDATE SKIP LOCKED through
--      the statement's snapshot, which can wait, rarely, on the newer
--      version of a row another fetch has just leased (the update-chain
--      walk 0028 removed from fetch_work_item).
--
-- The fix:
--   * Clock model, 0025's and 0031's: "now" for every visibility, lease and
--     session-liveness decision is the caller's clock carried forward
--     (p_now_ms plus the time elapsed since the statement started), re-read
--     after every step that can take time. The leases are computed last,
--     after every candidate is claimed, as the later of that caller-clock
--     now and the database clock, plus the timeout: each item's with
--     p_lock_timeout_ms, each session's with p_session_lock_timeout_ms (or
--     p_lock_timeout_ms). They are valid at return by both clocks,
--     whatever the caller's timestamp; a session this owner already holds
--     keeps a later expiry and a later last_activity_at than the call's.
--   * No wait on another fetch, a renewal or a stamp: the candidate query
--     locks nothing. Each candidate item is claimed as 0028 claims one (an
--     advisory try-lock of class 1401, shared with fetch_work_item, so a
--     single and a batched fetch never take one item twice), then
--     re-checked and row-locked with FOR UPDATE SKIP LOCKED in a new
--     statement. Each session as 0025 claims one (class 1400, shared with
--     fetch_work_item, then its row with SKIP LOCKED; only a call holding
--     the claim inserts a session row). A contended item is left for the
--     next candidate; a contended session, or one another owner took since
--     the scan, is left with all its items.
--   * No lock per row held to the commit. A claim is needed only until the
--     row lock it guards is taken or refused; from then the row lock holds
--     the item (or the session) to the commit. So claims are taken at
--     session level and let go at once: a call holds at most one item
--     claim and one session claim at a time, whatever its batch, and an
--     exception handler around the loop lets go of one an error leaves
--     held (a session-level lock outlives its transaction). The one claim
--     held to the commit is a new session's (its insert must keep a
--     second insert from waiting on it): at most p_max_new_sessions a
--     call. Upstream's fetch holds its candidates' row locks alone; the
--     shared lock table (max_locks_per_transaction times max_connections)
--     never holds more than those few entries for a call.
--   * Bounded: one candidate read, then a fixed number of statements per
--     candidate, at most 1024 candidates.
--   * No planner setting (0031's): the candidate query orders by session,
--     then id, which no index gives, and PostgreSQL kept the custom plans
--     that read idx_worker_visible up to the bound. Measured with 100,000
--     items scheduled for later and 30 visible, 10 taken a call: 50 rows
--     read in each of 10 calls on one session (upstream's, port: 40), no
--     cliff from the 6th call on.
--   * Bad input is rejected with SQLSTATE 22023 naming the parameter, as
--     the pack's fetch_work_item rejects it: p_now_ms NULL or negative;
--     p_lock_timeout_ms NULL, <= 0 or above one day;
--     p_session_lock_timeout_ms <= 0 or above one day (NULL still means
--     p_lock_timeout_ms). A NULL p_max_items returns no row and a NULL
--     p_max_new_sessions claims no new session (duroxide-pg passes both).
-- Upstream's indexes are left as they are; the fix adds none.
--
-- Which definitions it replaces: upstream's branch text (its fingerprint
-- as upstream's runner leaves it), the port of it the pack's tests use
-- (internal/testenv/upstream/inflight), the definition this file's Down
-- restores, or this fix (installed again, no change). Anything else (a
-- hand edit, a later upstream text, an overload) fails with SQLSTATE 55000
-- naming the function, and the transaction changes nothing.
--
-- Down identifies the definition the same way. Over this fix it restores
-- the unfixed definition: the pack's text, behaviourally identical to
-- upstream's (stale lease, waiting session upsert and all). Over
-- upstream's text or its port it leaves the definition as it is; over an
-- unknown one it refuses; with no fetch_work_items it does nothing.
--
-- Locks: no table lock: it only replaces a function (a call in flight
-- finishes on the old text, the next call uses the new one).
-- Duration: milliseconds, whatever the tables hold.
--
-- Down locks: no table lock: it only replaces a function, where the schema has
-- fetch_work_items (a call in flight finishes on the old text, the next call
-- uses the new one).
-- Down duration: milliseconds, whatever the tables hold.

-- +goose Up
-- +goose StatementBegin
DO $fix$
DECLARE
    v_count integer;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
BEGIN
    SELECT count(*) INTO v_count
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_work_items';
    IF v_count = 0 THEN
        RAISE NOTICE '0033: schema % has no fetch_work_items (no duroxide-pg release installed it): nothing to fix', current_schema();
        RETURN;
    END IF;

    SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_work_items'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text, p_max_items integer, p_max_new_sessions integer';
    IF NOT FOUND OR v_count > 1 THEN
        RAISE EXCEPTION '0033: fetch_work_items in schema % has % definition(s), none or more than one with the signature this migration knows; nothing was changed', current_schema(), v_count
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as INTO v_definition, v_behaves_as
    FROM (VALUES
        ('fetch_work_items', '661169cbe1943d7cefe5f1fdebc64ede', 'upstream branch 0022 batched fetch, unreleased', 22, false),
        ('fetch_work_items', '28a3539b3f2c9812d8e7dcf1335d7ff3', 'upstream branch 0022 batched fetch, port', 22, false),
        ('fetch_work_items', '27d36fb5e75593d1b8c4ddbd9ebc67a4', 'upstream batched 0022 + amendment 0028', 28, false),
        ('fetch_work_items', 'b0ca6b94d0a1c6ece9d1009cb4d42d36', 'pack 0033 Down, as upstream branch 0022', 22, false),
        ('fetch_work_items', '8e5295d4b64e94cbd74b98c025d46fb3', 'pack 0033 fix', 22, true)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0033: fetch_work_items in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;
    RAISE NOTICE '0033: fetch_work_items was %; installing the fix', v_definition;
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
    -- later of the caller's clock and the database's, plus the timeout.
    v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
    v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
    v_lease_start := greatest(v_now_ms, v_db_ms);

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
END;
$fix$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
DO $undo$
DECLARE
    v_count integer;
    v_raw text;
    v_normalized text;
    v_definition text;
    v_behaves_as integer;
    v_fixed boolean;
BEGIN
    SELECT count(*) INTO v_count
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_work_items';
    IF v_count = 0 THEN
        RAISE NOTICE '0033: schema % has no fetch_work_items: nothing to restore', current_schema();
        RETURN;
    END IF;

    SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
    INTO v_raw, v_normalized
    FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema()
      AND p.proname = 'fetch_work_items'
      AND pg_get_function_identity_arguments(p.oid)
          = 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text, p_max_items integer, p_max_new_sessions integer';
    IF NOT FOUND OR v_count > 1 THEN
        RAISE EXCEPTION '0033: fetch_work_items in schema % has % definition(s), none or more than one with the signature this migration knows; nothing was changed', current_schema(), v_count
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;

    -- (function, fingerprint, definition, upstream behaviour, carries the fix)
    SELECT k.definition, k.behaves_as, k.fixed INTO v_definition, v_behaves_as, v_fixed
    FROM (VALUES
        ('fetch_work_items', '661169cbe1943d7cefe5f1fdebc64ede', 'upstream branch 0022 batched fetch, unreleased', 22, false),
        ('fetch_work_items', '28a3539b3f2c9812d8e7dcf1335d7ff3', 'upstream branch 0022 batched fetch, port', 22, false),
        ('fetch_work_items', '27d36fb5e75593d1b8c4ddbd9ebc67a4', 'upstream batched 0022 + amendment 0028', 28, false),
        ('fetch_work_items', 'b0ca6b94d0a1c6ece9d1009cb4d42d36', 'pack 0033 Down, as upstream branch 0022', 22, false),
        ('fetch_work_items', '8e5295d4b64e94cbd74b98c025d46fb3', 'pack 0033 fix', 22, true)
    ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
    WHERE k.fingerprint IN (v_raw, v_normalized);
    IF NOT FOUND THEN
        RAISE EXCEPTION '0033: fetch_work_items in schema % has a definition this migration does not know (fingerprint %); nothing was changed', current_schema(), v_normalized
            USING ERRCODE = '55000',
                  HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
    END IF;
    IF NOT v_fixed THEN
        RAISE NOTICE '0033: fetch_work_items is %, which does not carry this fix: left as it is', v_definition;
        RETURN;
    END IF;
    RAISE NOTICE '0033: fetch_work_items was %; restoring the unfixed definition (upstream branch 0022''s behaviour)', v_definition;
    -- The unfixed definition: the pack's text of upstream's batched fetch,
    -- leases from p_now_ms, a candidate scan that locks, a session
    -- insert-or-update that can wait.
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
    v_scan integer;
    v_taken integer := 0;
    v_new_sessions integer := 0;
    v_held text[] := '{}';
    v_refused text[] := '{}';
    v_candidate record;
    v_row_count bigint;
    v_lock_token text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'fetch_work_items requires READ COMMITTED isolation, got %',
            current_setting('transaction_isolation');
    END IF;

    IF p_max_items <= 0 OR p_tag_mode = 'none' THEN
        RETURN;
    END IF;

    v_scan := least(greatest(p_max_items * 4, p_max_items), 1024);

    -- Candidates: visible and unleased, sessions grouped after the items
    -- without one, row-locked without waiting (SKIP LOCKED).
    FOR v_candidate IN
        SELECT q.id, q.session_id, s.worker_id AS live_owner
        FROM worker_queue q
        LEFT JOIN sessions s
               ON s.session_id = q.session_id
              AND s.locked_until > p_now_ms
        WHERE q.visible_at <= to_timestamp(p_now_ms / 1000.0)
          AND (q.lock_token IS NULL OR q.locked_until <= p_now_ms)
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
        FOR UPDATE OF q SKIP LOCKED
    LOOP
        EXIT WHEN v_taken >= p_max_items;

        -- Claim (or renew) the item's session for this owner, at most
        -- p_max_new_sessions of them not live-held by this owner: a session
        -- row is taken over only when it has expired or already belongs to
        -- this owner.
        IF v_candidate.session_id IS NOT NULL AND NOT (v_candidate.session_id = ANY (v_held)) THEN
            IF v_candidate.session_id = ANY (v_refused) THEN
                CONTINUE;
            END IF;
            IF v_candidate.live_owner IS NULL AND v_new_sessions >= p_max_new_sessions THEN
                CONTINUE;
            END IF;

            INSERT INTO sessions (session_id, worker_id, locked_until, last_activity_at)
            VALUES (v_candidate.session_id, p_owner_id,
                    p_now_ms + COALESCE(p_session_lock_timeout_ms, p_lock_timeout_ms), p_now_ms)
            ON CONFLICT (session_id) DO UPDATE
            SET worker_id = EXCLUDED.worker_id,
                locked_until = EXCLUDED.locked_until,
                last_activity_at = EXCLUDED.last_activity_at
            WHERE sessions.locked_until <= p_now_ms
               OR sessions.worker_id = p_owner_id;

            GET DIAGNOSTICS v_row_count = ROW_COUNT;
            IF v_row_count = 0 THEN
                -- Another owner got the session first: leave its items.
                v_refused := v_refused || v_candidate.session_id;
                CONTINUE;
            END IF;
            v_held := v_held || v_candidate.session_id;
            IF v_candidate.live_owner IS NULL THEN
                v_new_sessions := v_new_sessions + 1;
            END IF;
        END IF;

        -- Claim the item.
        v_lock_token := 'lock_' || gen_random_uuid()::text;
        UPDATE worker_queue q
        SET lock_token = v_lock_token,
            locked_until = p_now_ms + p_lock_timeout_ms,
            attempt_count = q.attempt_count + 1
        WHERE q.id = v_candidate.id
        RETURNING q.work_item, q.lock_token, q.attempt_count
        INTO out_work_item, out_lock_token, out_attempt_count;

        v_taken := v_taken + 1;
        RETURN NEXT;
    END LOOP;
END;
$fn$;
END;
$undo$;
-- +goose StatementEnd
