package demo

import "fmt"

// Model computes losses and gradients of the problem's MLP. It holds scratch buffers, allocated
// once by NewModel, so that Gradient and Evaluate do not allocate. A Model is not safe for
// concurrent use: give each worker its own.
//
// Arithmetic is float64 inside; parameters come in and gradients go out as float32.
type Model struct {
	p   *Problem
	cfg Config

	params []float64 // the parameters of the current call, widened
	grad   []float64 // the gradient being accumulated
	batch  []int     // indices into the training set

	// One example's activations.
	hidden []float64 // relu(x w1 + b1)
	logits []float64 // hidden w2 + b2, then the softmax probabilities
	dlog   []float64 // d loss / d logits
	dhid   []float64 // d loss / d hidden pre-activations
}

// NewModel returns a Model of p's MLP.
func NewModel(p *Problem) *Model {
	c := p.cfg
	n := p.NumParams()
	return &Model{
		p:      p,
		cfg:    c,
		params: make([]float64, n),
		grad:   make([]float64, n),
		batch:  make([]int, 0, c.BatchSize),
		hidden: make([]float64, c.Hidden),
		logits: make([]float64, c.Classes),
		dlog:   make([]float64, c.Classes),
		dhid:   make([]float64, c.Hidden),
	}
}

// Gradient computes the mean cross-entropy loss and its gradient over rank's batch for step.
//
// The training set is cut into ranks contiguous parts of nearly equal size; rank r owns part r.
// At each step a rank takes the next BatchSize/ranks examples (at least one) of its part,
// wrapping around at its end: step s covers positions [s*b, (s+1)*b) modulo the part's size.
// The batch is thus a function of (rank, ranks, step) alone, so a worker that joins late or
// retries a step computes the same batch, and the ranks' batches of one step are disjoint as long
// as b does not exceed the part's size.
//
// grad must have length NumParams and is overwritten with the gradient of the mean loss over the
// rank's examples; averaging the ranks' gradients gives the gradient over the global batch when
// ranks divides BatchSize. Gradient panics if the lengths are wrong, if rank is not in [0, ranks)
// or if there are more ranks than training examples.
func (m *Model) Gradient(params []float32, rank, ranks int, step int64, grad []float32) (loss float32) {
	m.checkParams(params)
	if len(grad) != len(m.params) {
		panic(fmt.Sprintf("demo: gradient has length %d, want %d", len(grad), len(m.params)))
	}
	m.batch = m.p.batch(m.batch[:0], rank, ranks, step)
	m.load(params)
	l := m.gradient(m.batch)
	for i, g := range m.grad {
		grad[i] = float32(g)
	}
	return float32(l)
}

// Evaluate returns the mean loss and the accuracy (in [0, 1]) of params on the test set.
func (m *Model) Evaluate(params []float32) (loss, accuracy float32) {
	m.checkParams(params)
	m.load(params)
	x, y := m.p.testX, m.p.testY
	f := m.cfg.Features
	var sum float64
	correct := 0
	for k, label := range y {
		l, predicted := m.forward(x[k*f:(k+1)*f], int(label))
		sum += l
		if predicted == int(label) {
			correct++
		}
	}
	return float32(sum / float64(len(y))), float32(float64(correct) / float64(len(y)))
}

func (m *Model) checkParams(params []float32) {
	if len(params) != len(m.params) {
		panic(fmt.Sprintf("demo: params has length %d, want %d", len(params), len(m.params)))
	}
}

func (m *Model) load(params []float32) {
	for i, v := range params {
		m.params[i] = float64(v)
	}
}

// batch appends to dst the training-set indices of rank's batch at step (see Model.Gradient).
func (p *Problem) batch(dst []int, rank, ranks int, step int64) []int {
	n := len(p.trainY)
	if ranks < 1 || rank < 0 || rank >= ranks {
		panic(fmt.Sprintf("demo: rank %d of %d", rank, ranks))
	}
	if ranks > n {
		panic(fmt.Sprintf("demo: %d ranks but only %d training examples", ranks, n))
	}
	lo, hi := rank*n/ranks, (rank+1)*n/ranks
	part := int64(hi - lo)
	b := max(p.cfg.BatchSize/ranks, 1)
	// (step*b) mod part without overflow, and non-negative for negative steps.
	start := (step%part + part) % part * (int64(b) % part) % part
	for i := range int64(b) {
		dst = append(dst, lo+int((start+i)%part))
	}
	return dst
}

// gradient sets m.grad to the gradient of the mean loss over the training examples idx at
// m.params, and returns that loss.
func (m *Model) gradient(idx []int) float64 {
	c := m.cfg
	f := c.Features
	clear(m.grad)
	gw1, gb1, gw2, gb2 := split(c, m.grad)
	_, _, w2, _ := split(c, m.params)
	scale := 1 / float64(len(idx))
	var loss float64
	for _, k := range idx {
		x := m.p.trainX[k*f : (k+1)*f]
		l, _ := m.forward(x, int(m.p.trainY[k]))
		loss += l

		// Softmax cross-entropy: d loss / d logits = (probabilities - onehot), here scaled for
		// the mean. m.logits holds the probabilities after forward.
		for j, q := range m.logits {
			m.dlog[j] = q * scale
		}
		m.dlog[m.p.trainY[k]] -= scale
		gb2 := gb2[:len(m.dlog)] // the reslicings here and below spare the loops bounds checks
		for j, d := range m.dlog {
			gb2[j] += d
		}
		for i, h := range m.hidden {
			if h == 0 { // inactive ReLU: no contribution to w2's gradient, none flows back
				m.dhid[i] = 0
				continue
			}
			row, grow := w2[i*c.Classes:][:len(m.dlog)], gw2[i*c.Classes:][:len(m.dlog)]
			var back float64
			for j, d := range m.dlog {
				grow[j] += float64(h * d)
				back += float64(row[j] * d)
			}
			m.dhid[i] = back
		}
		gb1 := gb1[:len(m.dhid)]
		for i, d := range m.dhid {
			gb1[i] += d
		}
		for i, xi := range x {
			xi := float64(xi)
			grow := gw1[i*c.Hidden:][:len(m.dhid)]
			for j, d := range m.dhid {
				grow[j] += float64(xi * d)
			}
		}
	}
	return loss * scale
}

// forward runs the MLP on one example: it leaves the hidden activations in m.hidden and the
// softmax probabilities in m.logits, and returns the cross-entropy loss for label and the
// predicted class (the first of the most probable).
func (m *Model) forward(x []float32, label int) (loss float64, predicted int) {
	c := m.cfg
	w1, b1, w2, b2 := split(c, m.params)
	h := m.hidden
	copy(h, b1)
	for i, xi := range x {
		xi := float64(xi)
		row := w1[i*c.Hidden:][:len(h)]
		for j, w := range row {
			h[j] += float64(xi * w)
		}
	}
	z := m.logits
	copy(z, b2)
	for i, hi := range h {
		if hi <= 0 {
			h[i] = 0 // ReLU
			continue
		}
		row := w2[i*c.Classes:][:len(z)]
		for j, w := range row {
			z[j] += float64(hi * w)
		}
	}
	for j, v := range z {
		if v > z[predicted] {
			predicted = j
		}
	}
	top := z[predicted]
	margin := z[label] - top // <= 0
	var sum float64
	for j, v := range z {
		z[j] = detExp(v - top)
		sum += z[j]
	}
	for j := range z {
		z[j] /= sum
	}
	// -log softmax(z)[label] = log sum_j e^(z_j - top) - (z_label - top); sum >= 1.
	return detLog(sum) - margin, predicted
}
