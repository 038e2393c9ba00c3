package wire

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Rejection counts that survive a lossy transport. Every rejection published on a job's rejects
// subject carries who made it (HdrRejectOrigin: a runtime's or a gateway's instance id, unique for
// the process's life) and that origin's cumulative counts for the job by reason (HdrRejectCounts).
// A counter that keeps, per origin, the latest counts it has seen, and sums them over origins, is
// exact even if it missed messages (a stream that keeps only the latest rejections per job, a slow
// counter): one message of each origin, its last, carries everything before it.
const (
	HdrRejectOrigin = "Fanin-Reject-Origin"
	HdrRejectCounts = "Fanin-Reject-Counts" // "reason=n,reason=n", reasons sorted
)

// RejectTally counts one origin's rejections by job and reason. It is safe for concurrent use.
type RejectTally struct {
	mu    sync.Mutex // guards byJob
	byJob map[string]map[Reason]int64
}

// Add counts a rejection of job for reason and returns the job's counts, formatted for
// HdrRejectCounts.
func (t *RejectTally) Add(job string, r Reason) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byJob == nil {
		t.byJob = map[string]map[Reason]int64{}
	}
	c := t.byJob[job]
	if c == nil {
		c = map[Reason]int64{}
		t.byJob[job] = c
	}
	c[r]++
	return FormatCounts(c)
}

// Forget drops a deleted job's counts.
func (t *RejectTally) Forget(job string) {
	t.mu.Lock()
	delete(t.byJob, job)
	t.mu.Unlock()
}

// FormatCounts formats counts for HdrRejectCounts.
func FormatCounts(c map[Reason]int64) string {
	keys := make([]string, 0, len(c))
	for r := range c {
		keys = append(keys, string(r))
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(c[Reason(k)], 10))
	}
	return b.String()
}

// ParseCounts parses a HdrRejectCounts value.
func ParseCounts(s string) (map[Reason]int64, error) {
	out := map[Reason]int64{}
	if s == "" {
		return out, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || k == "" || err != nil || n < 0 {
			return nil, fmt.Errorf("%s: %q is not reason=count", HdrRejectCounts, kv)
		}
		out[Reason(k)] = n
	}
	return out, nil
}
