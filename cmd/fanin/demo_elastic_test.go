package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fanin-ml/fanin/internal/testutil"
)

// TestElasticDemo runs `fanin dev --demo --elastic` on an in-process stack: the assignment changes
// as the workers leave, die and join (w0 alone holds every rank for a while, the joiners hold some
// at the end), and the final parameters are bit-identical to the same job on fixed ranks.
func TestElasticDemo(t *testing.T) {
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
