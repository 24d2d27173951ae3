-- 0035_worker_fetch_leases_bounded_by_the_database_clock.sql
-- Fixes: fetch_work_item, fetch_work_items
-- Lease bound: 30000 ms
--
-- Not an upstream migration: this pack's fix of how far the database clock
-- may lengthen the worker queue's leases. Records nothing in
-- _duroxide_migrations.
--
-- What: redefines fetch_work_item with 0031's signature, defaults,
-- RETURNS TABLE and body, and, where the schema has it, fetch_work_items
-- (upstream's batched worker fetch, on a branch) with 0033's; only the
-- leases' start changes, in both, as 0034 changes the orchestration
-- fetch's. It runs from the caller's clock carried forward (v_now_ms), and
-- the database clock (v_db_ms) may move it later by at most
-- c_lease_bound_ms (30000 ms, the "Lease bound" line above):
--
--     lease_start = v_now_ms + least(greatest(v_db_ms - v_now_ms, 0), c_lease_bound_ms)
--
-- The item's lease ends at lease_start + p_lock_timeout_ms, the session's
-- at lease_start + p_session_lock_timeout_ms (or p_lock_timeout_ms); a
-- session this owner already holds still keeps a later expiry.
--
-- Why: 0025 to 0033 start the leases at greatest(v_now_ms, v_db_ms), which
-- lets a database clock S ahead of the workers lengthen every item and
-- session lease by S, however large S is: the item of a worker that
-- crashed holding it (and its session) stays locked S longer than its
-- timeout by the workers' own clocks. With the bound it is taken over at
-- most bound + timeout after its claim, by the caller's clock, whatever
-- the database clock says. 0034's header has the bound's grounds (30 s:
-- duroxide-pg's pool acquire timeout, after which a fetch that waited for
-- a connection fails and never runs; doctor's critical clock skew) and the
-- trade: a caller more than the bound behind the database clock gets a
-- lease from its own clock plus the bound, with bound + timeout -
-- staleness left at return by the database clock (none past bound +
-- timeout), full by its own clock; doctor's skew and expired-lease
-- findings say why. Below the bound nothing changes: the seed's
-- reproduction A on the worker side (10 s stale, 5 s timeout) still gets a
-- full lease by the database clock.
--
-- Everything else of 0031's and 0033's bodies is unchanged: claims that
-- never wait (advisory try-locks of classes 1400 and 1401, SKIP LOCKED),
-- the bounds (32 candidates, 1024 for a batch), 0031's visibility bound
-- read from a setting the plan can see, visibility and liveness on the
-- caller's clock carried forward, no lock per row held to the commit in
-- the batch, bad input rejected with SQLSTATE 22023.
--
-- Which definitions it replaces. fetch_work_item: the ones the earlier
-- fixes know (upstream's text at 16..23, the pack's 0016 text, 0025's,
-- 0028's and 0031's fixes, upstream's branch fix of its generic plan, the
-- port the pack's tests use), or this fix (installed again, no change);
-- over upstream's branch fix it keeps what 0031 keeps (a plan that reads
-- the visible items only). fetch_work_items: upstream's branch text, its
-- port, the definition 0033's Down restores, 0033's fix, or this fix;
-- where the schema has no fetch_work_items (no duroxide-pg release has
-- shipped it; every pack-built schema) nothing is done for it. Anything
-- else (a hand edit, a later upstream text, an overload) fails with
-- SQLSTATE 55000 naming the function, and nothing is changed.
--
-- Locks: no table lock: it only replaces functions (a call in flight
-- finishes on the old text, the next call uses the new one); no row is read
-- or written.
-- Duration: milliseconds, whatever the tables hold.
--
-- Down identifies the definitions the same way. Over this fix it restores
-- 0031's fetch_work_item and 0033's fetch_work_items (the unbounded
-- leases); any other definition it knows is left as it is; an unknown one
-- is refused; with no fetch_work_items it does nothing for it.
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
    v_present text[] := '{}';
BEGIN
    -- Every function identified before anything changes.
    FOR v_function IN
        SELECT f.name, f.arguments, f.optional
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text', false),
            ('fetch_work_items', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text, p_max_items integer, p_max_new_sessions integer', true)
        ) AS f(name, arguments, optional)
    LOOP
        SELECT count(*) INTO v_count
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name;
        IF v_count = 0 AND v_function.optional THEN
            RAISE NOTICE '0035: schema % has no % (no duroxide-pg release installed it): nothing to fix', current_schema(), v_function.name;
            CONTINUE;
        END IF;

        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND OR v_count > 1 THEN
            RAISE EXCEPTION '0035: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 34 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false),
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', '3c21f180d28e8c5d9334f34cf9419e04', 'pack 0031 fix', 19, true),
            ('fetch_work_item', '6aaf60e360e8942b6b740a1382e2207e', 'pack 0035 fix', 19, true),
            ('fetch_work_items', '661169cbe1943d7cefe5f1fdebc64ede', 'upstream branch 0022 batched fetch, unreleased', 22, false),
            ('fetch_work_items', '28a3539b3f2c9812d8e7dcf1335d7ff3', 'upstream branch 0022 batched fetch, port', 22, false),
            ('fetch_work_items', '27d36fb5e75593d1b8c4ddbd9ebc67a4', 'upstream batched 0022 + amendment 0028', 28, false),
            ('fetch_work_items', 'b0ca6b94d0a1c6ece9d1009cb4d42d36', 'pack 0033 Down, as upstream branch 0022', 22, false),
            ('fetch_work_items', '8e5295d4b64e94cbd74b98c025d46fb3', 'pack 0033 fix', 22, true),
            ('fetch_work_items', 'fcdb3c264106b44e723aa4208d7a525c', 'pack 0035 fix', 22, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0035: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        RAISE NOTICE '0035: % was %; installing the fix', v_function.name, v_definition;
        v_present := v_present || v_function.name;
    END LOOP;

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

    IF 'fetch_work_items' = ANY (v_present) THEN
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
    END IF;
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
        SELECT f.name, f.arguments, f.optional
        FROM (VALUES
            ('fetch_work_item', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text', false),
            ('fetch_work_items', 'p_now_ms bigint, p_lock_timeout_ms bigint, p_owner_id text, p_session_lock_timeout_ms bigint, p_tag_filter text[], p_tag_mode text, p_max_items integer, p_max_new_sessions integer', true)
        ) AS f(name, arguments, optional)
    LOOP
        SELECT count(*) INTO v_count
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name;
        IF v_count = 0 AND v_function.optional THEN
            RAISE NOTICE '0035: schema % has no % (no duroxide-pg release installed it): nothing to restore', current_schema(), v_function.name;
            CONTINUE;
        END IF;

        SELECT md5(p.prosrc), md5(replace(replace(p.prosrc, n.nspname || '.', '@schema@.'), quote_literal(n.nspname), '''@schema@'''))
        INTO v_raw, v_normalized
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()
          AND p.proname = v_function.name
          AND pg_get_function_identity_arguments(p.oid) = v_function.arguments;
        IF NOT FOUND OR v_count > 1 THEN
            RAISE EXCEPTION '0035: schema % has % definition(s) of %, none or more than one with the signature this migration knows (%); nothing was changed', current_schema(), v_count, v_function.name, v_function.arguments
                USING ERRCODE = '55000',
                      HINT = 'This fix applies to a schema the pack took to version 34 or later, with one definition of each function it fixes. `harness doctor` shows what is installed.';
        END IF;

        -- (function, fingerprint, definition, upstream behaviour, carries the fix)
        SELECT k.definition INTO v_definition
        FROM (VALUES
            ('fetch_work_item', '5d3e664fd9550cee498ff683f89ab5a4', 'upstream 16-23', 19, false),
            ('fetch_work_item', '312d6f164b022ab783b7ce4a9ac3e1e8', 'pack 0016', 19, false),
            ('fetch_work_item', '0824e901fca4ea95922a3ab8856bcd81', 'pack 0025 fix', 19, true),
            ('fetch_work_item', 'e565496d53e1b807954d6fe004d40772', 'upstream branch 0022 generic-plan fix, port', 22, false),
            ('fetch_work_item', '4cc18c70dcdb8fa716f37e121b074580', 'pack 0028 fix', 19, true),
            ('fetch_work_item', '3c21f180d28e8c5d9334f34cf9419e04', 'pack 0031 fix', 19, true),
            ('fetch_work_item', '6aaf60e360e8942b6b740a1382e2207e', 'pack 0035 fix', 19, true),
            ('fetch_work_items', '661169cbe1943d7cefe5f1fdebc64ede', 'upstream branch 0022 batched fetch, unreleased', 22, false),
            ('fetch_work_items', '28a3539b3f2c9812d8e7dcf1335d7ff3', 'upstream branch 0022 batched fetch, port', 22, false),
            ('fetch_work_items', '27d36fb5e75593d1b8c4ddbd9ebc67a4', 'upstream batched 0022 + amendment 0028', 28, false),
            ('fetch_work_items', 'b0ca6b94d0a1c6ece9d1009cb4d42d36', 'pack 0033 Down, as upstream branch 0022', 22, false),
            ('fetch_work_items', '8e5295d4b64e94cbd74b98c025d46fb3', 'pack 0033 fix', 22, true),
            ('fetch_work_items', 'fcdb3c264106b44e723aa4208d7a525c', 'pack 0035 fix', 22, true)
        ) AS k(function_name, fingerprint, definition, behaves_as, fixed)
        WHERE k.function_name = v_function.name
          AND k.fingerprint IN (v_raw, v_normalized);
        IF NOT FOUND THEN
            RAISE EXCEPTION '0035: % in schema % has a definition this migration does not know (fingerprint %); nothing was changed', v_function.name, current_schema(), v_normalized
                USING ERRCODE = '55000',
                      HINT = 'It was edited by hand or comes from a duroxide-pg release newer than this pack knows. `harness doctor` shows what is installed; compare it with upstream''s before going on.';
        END IF;
        IF v_definition = 'pack 0035 fix' THEN
            v_restore := v_restore || v_function.name;
        ELSE
            RAISE NOTICE '0035: % is %, which does not carry this fix: left as it is', v_function.name, v_definition;
        END IF;
    END LOOP;

    IF 'fetch_work_item' = ANY (v_restore) THEN
        RAISE NOTICE '0035: fetch_work_item was pack 0035 fix; restoring 0031''s fix';
        -- 0031's fix, verbatim from 0031_worker_fetch_plans_with_its_bound.sql.
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
        -- later of the caller's clock and the database's, plus the timeout.
        v_db_ms := floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;
        v_now_ms := p_now_ms + (v_db_ms - v_stmt_ms);
        v_lease_start := greatest(v_now_ms, v_db_ms);

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
    END IF;

    IF 'fetch_work_items' = ANY (v_restore) THEN
        RAISE NOTICE '0035: fetch_work_items was pack 0035 fix; restoring 0033''s fix';
        -- 0033's fix, verbatim from 0033_worker_batch_fetch_lease_valid_at_return.sql.
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
    END IF;
END;
$undo$;
-- +goose StatementEnd
