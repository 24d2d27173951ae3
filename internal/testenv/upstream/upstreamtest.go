package upstream

import (
	"errors"
	"os"
	"testing"
)

// Require returns the real provider, or skips t with the reason it is
// missing; with HARNESS_REQUIRE_UPSTREAM=1 a missing provider fails t.
func Require(t testing.TB) *Provider {
	t.Helper()
	p, err := Find()
	if err == nil {
		return p
	}
	if os.Getenv(envRequire) == "1" || !errors.Is(err, errUnavailable) {
		t.Fatalf("%v (%s=1)", err, envRequire)
	}
	t.Skipf("%v", err)
	return nil
}
