package fanin_test

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/fanin-ml/fanin"

// floors are fanin's packages from the bottom up (README.md, "Floors"): a package imports only
// packages of its own floor or of a floor below. A path ending in "/..." holds every package under
// it; the longest matching path decides.
var floors = []struct {
	name  string
	paths []string
}{
	{"contracts", []string{"wire", "functions", "functions/guest", "functions/wasmfn", "job", "job/jobyaml", "gateway/api"}},
	{"foundations", []string{"internal/..."}},
	{"parts", []string{"runtime", "autoscaler", "autoscaler/kubedriver", "sdk", "sdk/prom"}},
	{"fronts", []string{"gateway", "dashboard", "sim"}},
	{"lab", []string{"lab/..."}},
	{"programs", []string{"cmd/...", "e2e", "deploy/...", "examples/...", "sdk/libfanin", "sdk/python/...", "."}},
}

// floorOf returns the floor of a package path relative to the module ("." for its root), or -1.
func floorOf(rel string) int {
	best, bestLen := -1, -1
	for i, f := range floors {
		for _, p := range f.paths {
			n := -1
			if dir, ok := strings.CutSuffix(p, "/..."); ok {
				if rel == dir || strings.HasPrefix(rel, dir+"/") {
					n = len(dir)
				}
			} else if rel == p {
				n = len(p)
			}
			if n > bestLen {
				best, bestLen = i, n
			}
		}
	}
	return best
}

// TestNoUpwardImports fails naming every import (tests' imports aside) that reaches a higher floor,
// and every package that is on no floor.
func TestNoUpwardImports(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	rel := func(path string) (string, bool) {
		if path == module {
			return ".", true
		}
		return strings.CutPrefix(path, module+"/")
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	for _, line := range lines {
		fields := strings.Fields(line)
		pkg, ok := rel(fields[0])
		if !ok {
			t.Fatalf("go list listed %s, outside the module", fields[0])
		}
		from := floorOf(pkg)
		if from < 0 {
			t.Errorf("%s is on no floor: add it to the table in floors_test.go and to README.md", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			dep, ok := rel(imp)
			if !ok {
				continue
			}
			if to := floorOf(dep); to > from {
				t.Errorf("%s (floor %s) imports %s (floor %s): a package imports only its own floor or lower",
					pkg, floors[from].name, dep, floors[to].name)
			}
		}
	}
	if len(lines) < 20 {
		t.Fatalf("go list listed %d packages:\n%s", len(lines), out)
	}
}

// TestFloorOf keeps the table's matching honest: exact paths, subtrees, and the longest match.
func TestFloorOf(t *testing.T) {
	t.Parallel()
	for rel, want := range map[string]string{
		"wire":                          "contracts",
		"gateway/api":                   "contracts",
		"gateway":                       "fronts",
		"internal/telemetry/traceshape": "foundations",
		"sdk":                           "parts",
		"sdk/libfanin":                  "programs",
		"lab/devstack":                  "lab",
		"cmd/fanin":                     "programs",
		".":                             "programs",
	} {
		if got := floorOf(rel); got < 0 || floors[got].name != want {
			t.Errorf("floorOf(%q) = %d, want floor %s", rel, got, want)
		}
	}
	for _, rel := range []string{"wirex", "gatewayx/api", "labs/x", "newpkg"} {
		if got := floorOf(rel); got >= 0 {
			t.Errorf("floorOf(%q) = floor %s, want none", rel, floors[got].name)
		}
	}
}
