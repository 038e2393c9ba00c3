package wire

import (
	"os"
	"strings"
	"testing"
)

// Every reason is documented: the data-plane ones in docs/PROTOCOL.md, all of them in docs/API.md.
func TestReasonsDocumented(t *testing.T) {
	t.Parallel()
	protocol, err := os.ReadFile("../docs/PROTOCOL.md")
	if err != nil {
		t.Fatal(err)
	}
	api, err := os.ReadFile("../docs/API.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Reason]bool{}
	for i, r := range Reasons {
		if seen[r.Code] {
			t.Errorf("reason %q appears twice", r.Code)
		}
		seen[r.Code] = true
		code := "`" + string(r.Code) + "`"
		if i < DataPlaneReasons && !strings.Contains(string(protocol), code) {
			t.Errorf("docs/PROTOCOL.md does not list %s", code)
		}
		if !strings.Contains(string(api), code) {
			t.Errorf("docs/API.md does not list %s", code)
		}
		if !KnownReason(r.Code) {
			t.Errorf("KnownReason(%q) = false", r.Code)
		}
	}
	if KnownReason("no_such_reason") {
		t.Error("KnownReason accepts an unknown code")
	}
}
