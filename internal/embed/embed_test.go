package embed

import "testing"

// The violation parser reads the server's log lines for JWT and nkey clients alike (nats.js
// clients are named by their nkey) and for anonymous ones.
func TestViolationLogger(t *testing.T) {
	t.Parallel()
	const user = "UAAXYV2L5JDPZKSAA3QY6K7N5MG3S3VJCUZWD3NWAKI6LSSNTKQQM46H"
	for line, want := range map[string]Violation{
		`127.0.0.1:5 - cid:9 - "v1.55.0:go" - "AB/jwt:` + user + `" - Publish Violation - Subject "fanin.v1.b.grad.0"`:            {User: user, Kind: "Publish", Subject: "fanin.v1.b.grad.0"},
		`127.0.0.1:5 - cid:9 - "v2:javascript" - "AB/nkey:` + user + `" - Subscription Violation - Subject "fanin.v1.b.params.*"`: {User: user, Kind: "Subscription", Subject: "fanin.v1.b.params.*"},
		`127.0.0.1:5 - cid:9 - Publish Violation - Reply "x.y"`:                                                                   {Kind: "Publish", Subject: "x.y"},
	} {
		var got []Violation
		l := &violationLogger{on: func(v Violation) { got = append(got, v) }}
		l.Errorf("%s", line)
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s\n got %+v, want %+v", line, got, want)
		}
	}
	var got []Violation
	l := &violationLogger{on: func(v Violation) { got = append(got, v) }}
	l.Errorf("%s", "some other error")
	if len(got) != 0 {
		t.Errorf("a line without a violation was taken for one: %+v", got)
	}
}
