package job

import "github.com/fanin-ml/fanin/functions"

// Shard is a contiguous run of the flattened parameter vector, with a stable id.
type Shard struct {
	ID     int     `json:"id"`
	Off    int     `json:"off"` // first element in the flattened vector
	Len    int     `json:"len"` // number of elements
	Pieces []Piece `json:"pieces"`
}

// Piece is the part of one tensor that lies in a shard.
type Piece struct {
	Tensor string `json:"tensor"`
	Off    int    `json:"off"` // first element within the tensor
	Len    int    `json:"len"`
}

// Bytes is the size of the shard's payload on the wire (float32).
func (s Shard) Bytes() int { return 4 * s.Len }

// Layout is how a job's parameters are cut into shards.
type Layout struct {
	Elements int     `json:"elements"`
	Shards   []Shard `json:"shards"`
}

// NumShards is the number of shards.
func (l Layout) NumShards() int { return len(l.Shards) }

// Ranges returns the shards' extents, as the reference implementation takes them.
func (l Layout) Ranges() []functions.Range {
	r := make([]functions.Range, len(l.Shards))
	for i, s := range l.Shards {
		r[i] = functions.Range{Off: s.Off, Len: s.Len}
	}
	return r
}

// Layout cuts the flattened parameters into shards of at most ShardSize bytes. It is a pure function
// of the tensors and ShardSize, so every worker and runtime derives the same layout:
//
//   - tensors are taken in spec order; consecutive small tensors are grouped into one shard while
//     they fit;
//   - a tensor that does not fit in the current shard starts a new one;
//   - a tensor larger than a shard is split into ceil(n/target) nearly equal shards of its own.
//
// Every element lies in exactly one shard, shards are contiguous, in order, and none is empty.
func (s *Spec) Layout() Layout {
	target := int(s.ShardSize / 4)
	if target < 1 {
		target = 1
	}
	var l Layout
	var cur *Shard
	closeCur := func() {
		if cur != nil {
			l.Shards = append(l.Shards, *cur)
			cur = nil
		}
	}
	off := 0
	for _, t := range s.Tensors {
		n := t.Elements()
		switch {
		case cur != nil && cur.Len+n <= target:
			cur.Pieces = append(cur.Pieces, Piece{Tensor: t.Name, Len: n})
			cur.Len += n
		case n <= target:
			closeCur()
			cur = &Shard{ID: len(l.Shards), Off: off, Len: n, Pieces: []Piece{{Tensor: t.Name, Len: n}}}
		default:
			closeCur()
			parts := (n + target - 1) / target
			for k := 0; k < parts; k++ {
				lo, hi := k*n/parts, (k+1)*n/parts
				l.Shards = append(l.Shards, Shard{
					ID: len(l.Shards), Off: off + lo, Len: hi - lo,
					Pieces: []Piece{{Tensor: t.Name, Off: lo, Len: hi - lo}},
				})
			}
		}
		off += n
	}
	closeCur()
	l.Elements = off
	return l
}
