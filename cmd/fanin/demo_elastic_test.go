package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/lab/testutil"
)

// TestElasticDemo runs `fanin dev --demo --elastic` on an in-process stack: the assignment changes
// as the workers leave, die (a stall shown while it lasts) and join (w0 alone holds every rank for a while, the joiners hold some
// at the end), and the final parameters are bit-identical to the same job on fixed ranks.
func TestElasticDemo(t *testing.T) {
	t.Parallel()
	st := testutil.Stack(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := runElasticDemo(ctx, st, demoConfig{steps: 120, ranks: 4, every: 4, function: "adam", lr: 0.01}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	if !strings.Contains(s, "bit-identical to the same job on 4 fixed ranks") {
		t.Fatalf("no verdict:\n%s", s)
	}
	for _, ev := range []string{"after step 24: w3 leaves", "after step 48: w2 dies", "after step 72: w1 leaves", "after step 96: w4 and w5 join"} {
		if !strings.Contains(s, ev) {
			t.Errorf("no %q:\n%s", ev, s)
		}
	}
	if !regexp.MustCompile(`waiting 1 s for step (49|5[0-3]) `).MatchString(s) { // w2 died after step 48
		t.Errorf("the stall after w2's death was not shown:\n%s", s)
	}
	if !strings.Contains(s, "w0[0 1 2 3]") {
		t.Errorf("w0 never held every rank alone:\n%s", s)
	}
	if !regexp.MustCompile(`w[45]\[\d`).MatchString(s) {
		t.Errorf("the joiners never held a rank:\n%s", s)
	}
	if !regexp.MustCompile(`\((4|5|6|7|8)\)\n`).MatchString(s) {
		t.Errorf("the assignment's epoch never reached 4:\n%s", s)
	}
}

// TestRecentRate: the elastic demo's steps/s is over the last rateWindow and counts a stall in it,
// however few steps came after.
func TestRecentRate(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	done := map[int64]time.Time{0: t0}
	at := t0
	for s := int64(1); s <= 100; s++ { // 50 steps/s
		at = at.Add(20 * time.Millisecond)
		done[s] = at
	}
	if r := recentRate(done, 100, 2*time.Second); r < 49.99 || r > 50.01 {
		t.Errorf("steady: %v steps/s, want 50", r)
	}
	at = at.Add(3 * time.Second) // a stall longer than the window, then 4 steps at 50/s
	for s := int64(101); s <= 104; s++ {
		done[s] = at
		at = at.Add(20 * time.Millisecond)
	}
	if r := recentRate(done, 104, 2*time.Second); r > 2 {
		t.Errorf("after a 3 s stall: %v steps/s, want under 2 (4 steps in 3.06 s)", r)
	}
	if r := recentRate(done, 3, 2*time.Second); r < 49.99 || r > 50.01 {
		t.Errorf("from the start: %v steps/s, want 50", r)
	}
	if r := recentRate(done, 0, 2*time.Second); r != 0 {
		t.Errorf("at the start: %v, want 0", r)
	}
}
