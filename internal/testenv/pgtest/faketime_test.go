package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A server started with a clock offset reads its clock that far from this
// process's (clock_timestamp(), now()); the monotonic clock is left alone
// (FAKETIME_DONT_FAKE_MONOTONIC), so the server's own timeouts keep their
// length.
func TestAServerWithAClockOffsetRunsThatFarAhead(t *testing.T) {
	const offset = 120 * time.Second
	srv := RequireSkewedServer(t, offset)
	before := time.Now()
	dbMs := query[int64](t, srv, "postgres", "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
	after := time.Now()
	mid := before.Add(after.Sub(before) / 2).UnixMilli()
	require.InDelta(t, offset.Milliseconds(), dbMs-mid, 2000, "the database clock minus this process's")
	require.InDelta(t, offset.Milliseconds(), query[int64](t, srv, "postgres",
		"SELECT (extract(epoch FROM now()) * 1000)::bigint")-time.Now().UnixMilli(), 2000, "now() as well")
	ctx := context.Background()
	require.NoError(t, srv.Restart(ctx), "a restart keeps the offset")
	dbMs = query[int64](t, srv, "postgres", "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
	require.InDelta(t, offset.Milliseconds(), dbMs-time.Now().UnixMilli(), 2000, "after a restart")
}

func TestAClockOffsetIsRefusedWhereTheServerIsNotOurs(t *testing.T) {
	for _, opts := range []Options{
		{Backend: DSN, DSN: "postgres://x@127.0.0.1:1/postgres", ClockOffset: time.Minute},
		{Backend: Docker, ClockOffset: time.Minute},
		{DSN: "postgres://x@127.0.0.1:1/postgres", ClockOffset: time.Minute},
	} {
		_, err := Start(context.Background(), opts)
		require.ErrorContains(t, err, "needs the local backend", "%+v", opts)
	}
	_, err := FaketimeEnv(1500 * time.Millisecond)
	require.ErrorContains(t, err, "whole number of seconds")
	env, err := FaketimeEnv(0)
	require.NoError(t, err)
	require.Nil(t, env)
}
