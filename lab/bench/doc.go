// Package bench measures fanin's data plane against baselines measured in the same run, on the same bytes.
package bench
