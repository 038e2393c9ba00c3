package job

import (
	"errors"
	"strings"
	"testing"
)

func TestParseFunctionRef(t *testing.T) {
	t.Parallel()
	r, ok := ParseFunctionRef("team-a/lion@12")
	if !ok || r != (FunctionRef{Owner: "team-a", Name: "lion", Version: 12}) || r.String() != "team-a/lion@12" {
		t.Fatalf("ParseFunctionRef = %+v, %v", r, ok)
	}
	for _, bad := range []string{"adam", "team/lion", "team/lion@0", "team/lion@v1", "Team/lion@1", "a/b/c@1", "/lion@1", "team/1lion@1", "team/lion@1 "} {
		if _, ok := ParseFunctionRef(bad); ok {
			t.Errorf("ParseFunctionRef(%q) accepted", bad)
		}
	}
}

func TestUserFunctionSpec(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		fn   Function
		want string // "" valid
	}{
		{Function{Name: "team-a/lion@1", Hyper: map[string]float64{"anything": 3}}, ""},
		{Function{Name: "team-a/lion@1", Module: strings.Repeat("ab", 32), Slots: 1}, ""},
		{Function{Name: "team-a/lion"}, "function: a user function is named <owner>/<name>@<version>"},
		{Function{Name: "team-a/lion@1", Module: "xyz"}, "function.module: must be a sha256 in hex"},
		{Function{Name: "team-a/lion@1", Slots: 9}, "function.slots: must be 0..8, got 9"},
		{Function{Name: "sgd", Hyper: map[string]float64{"lr": 1}, Slots: 1}, "belong to user functions"},
	} {
		s := validSpec()
		s.Function = c.fn
		s.Normalize()
		err := s.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.fn, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v, want %q", c.fn, err, c.want)
		}
	}
	s := validSpec()
	s.Function = Function{Name: "team-a/adam-ish@2", Slots: 2}
	if n, err := s.FuncSlots(); n != 2 || err != nil {
		t.Errorf("FuncSlots = %d, %v", n, err)
	}
	if _, err := s.NewFunc(); !errors.Is(err, ErrNeedsModule) {
		t.Errorf("NewFunc of a user function: %v", err)
	}
}
