package e2e

import (
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestDevDemo runs the README's command: `fanin dev --demo --steps 50` exits 0 and the demo model's
// test accuracy rises.
func TestDevDemo(t *testing.T) {
	t.Parallel()
	skipShort(t)
	p := start(t, "fanin dev", "dev", "--demo", "--steps", "50", "--nats-port", "-1", "--http", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--log-level", "warn")
	if err := p.wait(t, 120*time.Second); err != nil {
		t.Fatalf("fanin dev --demo exited with %v:\n%s", err, p.output())
	}
	m := regexp.MustCompile(`demo finished: (\d+) steps .* test accuracy ([0-9.]+) -> ([0-9.]+)`).FindStringSubmatch(p.output())
	if m == nil {
		t.Fatalf("no summary in the output:\n%s", p.output())
	}
	before, _ := strconv.ParseFloat(m[2], 64)
	after, _ := strconv.ParseFloat(m[3], 64)
	if m[1] != "50" || after < before+0.2 {
		t.Fatalf("demo ran %s steps, accuracy %.3f -> %.3f; want 50 steps and a rise of at least 0.2:\n%s", m[1], before, after, p.output())
	}
	t.Logf("demo: accuracy %.3f -> %.3f", before, after)
}
