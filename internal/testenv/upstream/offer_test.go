package upstream

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestApplyHunksReplacesTheLinesItFindsInTheBodyOnce(t *testing.T) {
	md := "x\n```diff\n@@ one @@\n   a := 1;\n+  b := 2;\n@@ two @@\n-  c := 3;\n+  c := 4;\n+  d := 5;\n```\n"
	hunks, err := ParseHunks(md)
	require.NoError(t, err)
	require.Equal(t, []Hunk{
		{Header: "@@ one @@", Old: []string{"  a := 1;"}, New: []string{"  a := 1;", "  b := 2;"}},
		{Header: "@@ two @@", Old: []string{"  c := 3;"}, New: []string{"  c := 4;", "  d := 5;"}},
	}, hunks)

	text := "a := 1;\nAS $body$\n    a := 1;\n    c := 3;\n$body$\nc := 3;"
	got, err := ApplyHunks(text, hunks)
	require.NoError(t, err)
	require.Equal(t, "a := 1;\nAS $body$\n  a := 1;\n  b := 2;\n  c := 4;\n  d := 5;\n$body$\nc := 3;", got, "only the body changes")

	_, err = ApplyHunks("AS $body$\n c := 3;\n c := 3;\n$body$", hunks[1:])
	require.ErrorContains(t, err, "matches at lines 2 and 3")
	_, err = ApplyHunks("AS $body$\n e := 3;\n$body$", hunks[1:])
	require.ErrorContains(t, err, "does not match")
	_, err = ParseHunks("```diff\n+x\n```")
	require.ErrorContains(t, err, "before any @@ header")
}

// functionStatement is the CREATE OR REPLACE FUNCTION statement of a
// migration file as upstream's runner runs it (comments cut).
func functionStatement(t *testing.T, text string) string {
	t.Helper()
	pre := Preprocess(text)
	i := strings.Index(pre, "CREATE OR REPLACE FUNCTION")
	j := strings.LastIndex(pre, "$body$ LANGUAGE plpgsql;")
	require.True(t, i >= 0 && j > i, "a CREATE OR REPLACE FUNCTION ... $body$ LANGUAGE plpgsql; statement")
	return pre[i:j]
}

// Both forms of the offer give each function one text: the edit of the
// branch file (its hunks applied to our port) and the separate migration
// define the same function. Each file is one DO block for upstream's
// runner, and names itself in its notice.
func TestTheOffersTwoFormsDefineOneFunction(t *testing.T) {
	for _, c := range []struct {
		name             string
		edited           func() (string, error)
		separate         func() (string, string, error)
		port             func() (string, error)
		editFile, notice string
	}{
		{"fetch_orchestration_item", EditedCandidate, Amendment, func() (string, error) { return CandidatePort(), nil }, CandidateFile, "Migration 0024: "},
		{"fetch_work_items", EditedBatched, BatchedAmendment, func() (string, error) { return InFlightPort(InFlightBatchedFetch) }, InFlightBatchedFetch, "Migration 0022: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := toolsDir(); err != nil {
				t.Skipf("the offer is read from the repository's upstream/ folder: %v", err)
			}
			edited, err := c.edited()
			require.NoError(t, err)
			file, separate, err := c.separate()
			require.NoError(t, err)
			port, err := c.port()
			require.NoError(t, err)
			require.Equal(t, functionStatement(t, separate), functionStatement(t, edited), "%s defines the edited function", file)
			require.NotEqual(t, functionStatement(t, port), functionStatement(t, edited), "the edit changes the function")
			require.Contains(t, functionStatement(t, edited), "c_max_clock_lead_ms CONSTANT BIGINT := 30000;")

			for name, text := range map[string]string{c.editFile + " (edited)": edited, file: separate} {
				stmts := SplitStatements(Preprocess(text))
				require.Len(t, stmts, 1, "%s: one statement for upstream's runner", name)
				require.True(t, strings.HasPrefix(stmts[0], "DO $$"), name)
				require.Equal(t, Preprocess(text), stmts[0]+";", "%s: the runner's split loses nothing", name)
			}
			v, err := VersionOf(file)
			require.NoError(t, err)
			require.Contains(t, Preprocess(separate), fmt.Sprintf("RAISE NOTICE 'Migration %04d: ", v))
			require.Contains(t, separate, fmt.Sprintf("\n-- Migration %04d: ", v))
			require.True(t, strings.HasPrefix(separate, "-- Copyright (c) Microsoft Corporation.\n-- Licensed under the MIT License.\n"), "upstream's header")
			require.Contains(t, Preprocess(edited), "RAISE NOTICE '"+c.notice, "the edit leaves the file's own notice")
		})
	}
}
