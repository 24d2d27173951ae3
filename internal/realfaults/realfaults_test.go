package realfaults

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRuntimeClassKnowsOnlyTheRuntimesOwnFailures(t *testing.T) {
	for text, want := range map[string]bool{
		// As the client reported them in the runs of docs/RELIABILITY.md.
		"infrastructure:ack_orchestration_item: Database error: error returned from database: terminating connection due to administrator command": true,
		"infrastructure:ack_orchestration_item: I/O error: error communicating with database: Connection reset by peer (os error 104)":             true,
		"infrastructure:ack_orchestration_item: Invalid lock token":                                                                                false,
		"Activity 'Square' JS execution failed: GenericFailure, Error: boom":                                                                       false,
		"": false,
	} {
		require.Equal(t, want, RuntimeClass(text) != "", "%q", text)
	}
}

func TestProblemsNameEverythingThePackMustNotShow(t *testing.T) {
	sound := SideReport{Orchestrations: 10, Completed: 8, Failed: 2,
		Failures:     map[string]int{"infrastructure:ack_orchestration_item: terminating connection due to administrator command": 2},
		Unclassified: map[string]int{}}
	require.Empty(t, sound.Problems())

	bad := SideReport{Orchestrations: 10, Completed: 4, Wrong: 1, Failed: 2, Lost: 2, Twice: 1,
		Unclassified: map[string]int{"Invalid lock token": 1}}
	require.Equal(t, []string{
		"2 of 10 orchestrations lost (not terminal at the deadline)",
		"1 completed with a wrong output",
		"1 executions with more than one terminal event",
		"1 failed outside the runtime's failure classes: Invalid lock token",
		"the counts add up to 9, not 10",
	}, bad.Problems())
}

func TestReplaceSectionNeedsBothMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	require.NoError(t, os.WriteFile(path, []byte("no markers\n"), 0o644))
	require.ErrorContains(t, ReplaceSection(path, "x"), "no section marked")
	require.NoError(t, os.WriteFile(path, []byte(EndMarker+"\n"+BeginMarker+"\n"), 0o644))
	require.ErrorContains(t, ReplaceSection(path, "x"), "no section marked", "markers out of order")

	require.NoError(t, os.WriteFile(path, []byte("a\n"+BeginMarker+"\nold\n"+EndMarker+"\nb\n"), 0o644))
	require.NoError(t, ReplaceSection(path, "new\n"))
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "a\n"+BeginMarker+"\nnew\n"+EndMarker+"\nb\n", string(got))
}

func TestFaketimeEnvSetsTheOffsetInSeconds(t *testing.T) {
	env, err := faketimeEnv(0)
	require.NoError(t, err)
	require.Nil(t, env, "no offset, no libfaketime")
	for offset, want := range map[time.Duration]string{
		30 * time.Second:   "FAKETIME=+30s",
		-120 * time.Second: "FAKETIME=-120s",
	} {
		env, err := faketimeEnv(offset)
		if err == ErrNoFaketime {
			t.Skip(err)
		}
		require.NoError(t, err)
		require.Contains(t, env, want)
		require.Contains(t, env, "FAKETIME_DONT_FAKE_MONOTONIC=1")
	}
}
