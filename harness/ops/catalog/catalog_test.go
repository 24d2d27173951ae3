package catalog

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const base = `{"tables":[{"name":"t","columns":[{"name":"a","type":"bigint","not_null":true,"default":null},
 {"name":"b","type":"text","not_null":false,"default":null}],"constraints":[],"indexes":[]}],
 "functions":[{"name":"f","identity_args":"p bigint","args":"p bigint","result":"void","language":"plpgsql","volatility":"v","security_definer":false,"strict":false}],
 "sequences":[]}`

func snap(t *testing.T, s string) Snapshot {
	t.Helper()
	out, err := Canonical([]byte(s))
	require.NoError(t, err)
	return out
}

func TestDiffOfEqualCatalogsIsEmpty(t *testing.T) {
	require.Empty(t, Diff(snap(t, base), snap(t, base)))
}

func TestDiffNamesTheChangedAttribute(t *testing.T) {
	got := strings.Replace(base, `"type":"text"`, `"type":"integer"`, 1)
	d := Diff(snap(t, base), snap(t, got))
	require.Equal(t, "~ differs  table t column b type: want \"text\", got \"integer\"\n", d)
}

func TestDiffReportsAMissingFunctionOnce(t *testing.T) {
	got := strings.Replace(base, `"name":"f"`, `"name":"g"`, 1)
	d := Diff(snap(t, base), snap(t, got))
	require.Equal(t, "- missing  function f(p bigint) (result \"void\")\n+ extra    function g(p bigint) (result \"void\")\n", d)
}

func TestDiffSeesColumnOrder(t *testing.T) {
	swapped := `{"tables":[{"name":"t","columns":[{"name":"b","type":"text","not_null":false,"default":null},
 {"name":"a","type":"bigint","not_null":true,"default":null}],"constraints":[],"indexes":[]}],
 "functions":[{"name":"f","identity_args":"p bigint","args":"p bigint","result":"void","language":"plpgsql","volatility":"v","security_definer":false,"strict":false}],
 "sequences":[]}`
	d := Diff(snap(t, base), snap(t, swapped))
	require.Contains(t, d, "table t column a position: want 1, got 2")
}

func TestEmpty(t *testing.T) {
	require.True(t, snap(t, `{"tables":[],"functions":[],"sequences":[]}`).Empty())
	require.False(t, snap(t, base).Empty())
}
