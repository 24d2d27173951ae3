package settings

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

type knobs struct {
	count    int
	wait     time.Duration
	sizes    []int
	derived  bool
	flagSeen bool
}

func (k *knobs) list() *List {
	l := New("test: ")
	l.Int(&k.count, "Count", 3, 1).Flag("count", "a count")
	l.Duration(&k.wait, "Wait", time.Second, 0)
	l.Ints(&k.sizes, "Sizes", []int{1, 2}, 0).Flag("sizes", "sizes").OnSet(func() { k.flagSeen = true })
	l.After(func() { k.derived = k.wait > 0 })
	return l
}

func TestFillSetsZerosAndKeepsWhatIsGiven(t *testing.T) {
	k := knobs{wait: 2 * time.Second, sizes: []int{}}
	k.list().Fill()
	require.Equal(t, 3, k.count, "a zero count takes its default")
	require.Equal(t, 2*time.Second, k.wait, "a duration given stays")
	require.Empty(t, k.sizes, "an empty list is taken as given")
	require.True(t, k.derived, "After runs once the defaults are in")

	var fresh knobs
	fresh.list().Fill()
	require.Equal(t, []int{1, 2}, fresh.sizes, "a nil list takes its default")
	fresh.sizes[0] = 9
	var other knobs
	other.list().Fill()
	require.Equal(t, []int{1, 2}, other.sizes, "the default list is copied, not shared")
}

func TestCheckNamesTheFirstSettingBelowItsLeast(t *testing.T) {
	k := knobs{count: 0, wait: time.Second}
	require.EqualError(t, k.list().Check(), "test: Count 0: at least 1")
	k = knobs{count: 1, wait: -time.Second}
	require.EqualError(t, k.list().Check(), "test: Wait must not be negative")
	k = knobs{count: 1, sizes: []int{4, -1}}
	require.EqualError(t, k.list().Check(), "test: Sizes must not be negative")
	k = knobs{count: 1, sizes: []int{0}}
	require.NoError(t, k.list().Check())
}

func TestRegisterParsesAndCheckHoldsToTheLeast(t *testing.T) {
	parse := func(args ...string) (knobs, error) {
		var k knobs
		l := k.list()
		l.Fill()
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		l.Register(fs)
		if err := fs.Parse(args); err != nil {
			return k, err
		}
		return k, l.Check()
	}
	k, err := parse()
	require.NoError(t, err)
	require.Equal(t, 3, k.count, "the default is the flag's")
	require.False(t, k.flagSeen)

	k, err = parse("--count", "5", "--sizes", " 10, 20 ,")
	require.NoError(t, err)
	require.Equal(t, 5, k.count)
	require.Equal(t, []int{10, 20}, k.sizes)
	require.True(t, k.flagSeen, "OnSet runs when the flag is given")

	for _, bad := range [][]string{{"--count", "0"}, {"--count", "x"}, {"--sizes", ""}, {"--sizes", "1k"}, {"--sizes", "-1"}, {"--wait", "1s"}} {
		_, err := parse(bad...)
		require.Error(t, err, "%v", bad)
	}
}

// The flags' help reads as the flag package's own: the kind of a count or
// a duration, no zero default shown.
func TestRegisteredFlagsPrintLikeTheFlagPackages(t *testing.T) {
	var k knobs
	l := k.list()
	l.Fill()
	k.count = 0
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	l.Register(fs)
	fs.PrintDefaults()
	require.Contains(t, help.String(), "-count int")
	require.NotContains(t, help.String(), "(default 0)")
	require.Contains(t, help.String(), "(default 1,2)")
}

func TestCountLists(t *testing.T) {
	ns, err := parseInts(" 1000, 10000 ,100000,")
	require.NoError(t, err)
	require.Equal(t, []int{1000, 10000, 100000}, ns)
	require.Equal(t, "0,10000,100000", joinInts([]int{0, 10000, 100000}))
	_, err = parseInts(",")
	require.Error(t, err)
}
