package demo

import (
	"errors"
	"fmt"
	"math"
)

// Tensor names one parameter tensor and its shape. Parameters are flattened row-major and
// concatenated in the order of Problem.Tensors.
type Tensor struct {
	Name  string
	Shape []int
}

// Size returns the number of elements of t.
func (t Tensor) Size() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Config describes the data set and the model.
type Config struct {
	Classes   int    // number of labels
	Features  int    // input dimension
	Hidden    int    // width of the hidden layer
	TrainSize int    // examples in the training set
	TestSize  int    // examples in the test set
	Seed      uint64 // seed of the data set (parameters have their own, see InitParams)
	BatchSize int    // global batch: each of R ranks takes BatchSize/R examples (at least 1) a step
}

// DefaultConfig returns the demo job's configuration: 10 classes in 32 dimensions, an MLP
// 32 -> 64 -> 10, 8192 training and 2048 test examples, and a global batch of 256.
func DefaultConfig() Config {
	return Config{
		Classes:   10,
		Features:  32,
		Hidden:    64,
		TrainSize: 8192,
		TestSize:  2048,
		Seed:      1,
		BatchSize: 256,
	}
}

// ErrInvalidConfig is wrapped by the errors of Config.Validate.
var ErrInvalidConfig = errors.New("demo: invalid config")

// Validate reports whether c describes a problem NewProblem can build.
func (c Config) Validate() error {
	for _, f := range []struct {
		name   string
		v, min int
	}{
		{"Classes", c.Classes, 2},
		{"Features", c.Features, 1},
		{"Hidden", c.Hidden, 1},
		{"TrainSize", c.TrainSize, 1},
		{"TestSize", c.TestSize, 1},
		{"BatchSize", c.BatchSize, 1},
	} {
		if f.v < f.min {
			return fmt.Errorf("%w: %s is %d, want at least %d", ErrInvalidConfig, f.name, f.v, f.min)
		}
	}
	return nil
}

// The shape of the data. Each class is a mixture of a few blobs, so that no linear boundary
// separates the classes, and the whole space is then bent by a fixed random map, so that even the
// blobs are not Gaussian: an MLP does clearly better than softmax regression.
const (
	modesPerClass = 4   // blobs per class
	centerSpread  = 1.0 // standard deviation of a blob centre's coordinates
	blobNoise     = 0.9 // standard deviation of a point around its blob centre
	warpGain      = 1.5 // scale of the random linear map before the squashing nonlinearity
)

// Problem is a seeded synthetic classification data set: a training set and a test set drawn
// from the same distribution. It is immutable and safe to share between Models.
type Problem struct {
	cfg    Config
	trainX []float32 // TrainSize x Features, row-major
	trainY []int32
	testX  []float32 // TestSize x Features, row-major
	testY  []int32
}

// NewProblem generates the data set described by cfg. The data depend on cfg.Seed, Classes and
// Features; TrainSize and TestSize only truncate or extend their sets. NewProblem panics if
// cfg.Validate fails.
func NewProblem(cfg Config) *Problem {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	g := newGenerator(cfg)
	p := &Problem{cfg: cfg}
	p.trainX, p.trainY = g.sample(newRNG(cfg.Seed, streamTrain), cfg.TrainSize)
	p.testX, p.testY = g.sample(newRNG(cfg.Seed, streamTest), cfg.TestSize)
	return p
}

// Config returns the configuration p was built from.
func (p *Problem) Config() Config { return p.cfg }

// generator draws points of a problem: the blob centres and the warp.
type generator struct {
	classes, features int
	centers           []float64 // (class*modesPerClass + mode) x features
	warp              []float64 // features x features, row-major: out_j = sum_i in_i warp[i][j]
	bias              []float64 // features
	u                 []float64 // scratch: one point before the warp
}

func newGenerator(cfg Config) *generator {
	f := cfg.Features
	g := &generator{
		classes:  cfg.Classes,
		features: f,
		centers:  make([]float64, cfg.Classes*modesPerClass*f),
		warp:     make([]float64, f*f),
		bias:     make([]float64, f),
		u:        make([]float64, f),
	}
	r := newRNG(cfg.Seed, streamCenters)
	for i := range g.centers {
		g.centers[i] = centerSpread * r.bell()
	}
	r = newRNG(cfg.Seed, streamWarp)
	scale := warpGain / math.Sqrt(float64(f))
	for i := range g.warp {
		g.warp[i] = scale * r.bell()
	}
	for i := range g.bias {
		g.bias[i] = 0.5 * r.bell()
	}
	return g
}

// sample draws n labelled points from r.
func (g *generator) sample(r rng, n int) (x []float32, y []int32) {
	f := g.features
	x = make([]float32, n*f)
	y = make([]int32, n)
	for k := range n {
		class := r.intn(g.classes)
		center := g.centers[(class*modesPerClass+r.intn(modesPerClass))*f:][:f]
		for i, c := range center {
			g.u[i] = c + float64(blobNoise*r.bell())
		}
		out := x[k*f : (k+1)*f]
		for j := range out {
			v := g.bias[j]
			for i, ui := range g.u {
				v += float64(ui * g.warp[i*f+j])
			}
			out[j] = float32(v / math.Sqrt(1+float64(v*v))) // a tanh-like squash without exp
		}
		y[k] = int32(class)
	}
	return x, y
}

// Tensors returns the parameter tensors in flattening order: w1 [Features, Hidden], b1 [Hidden],
// w2 [Hidden, Classes], b2 [Classes]. The hidden layer is h = relu(x w1 + b1), the logits
// h w2 + b2.
func (p *Problem) Tensors() []Tensor {
	c := p.cfg
	return []Tensor{
		{Name: "w1", Shape: []int{c.Features, c.Hidden}},
		{Name: "b1", Shape: []int{c.Hidden}},
		{Name: "w2", Shape: []int{c.Hidden, c.Classes}},
		{Name: "b2", Shape: []int{c.Classes}},
	}
}

// NumParams returns the total number of parameters, the length of every parameter and gradient
// vector.
func (p *Problem) NumParams() int {
	c := p.cfg
	return c.Features*c.Hidden + c.Hidden + c.Hidden*c.Classes + c.Classes
}

// InitParams returns freshly initialised parameters, a function of seed only: w1 He-uniform (for
// the ReLU that follows), w2 Glorot-uniform, biases zero.
func (p *Problem) InitParams(seed uint64) []float32 {
	c := p.cfg
	params := make([]float32, p.NumParams())
	w1, _, w2, _ := p.split(params)
	r := newRNG(seed, streamInit)
	limit := math.Sqrt(6 / float64(c.Features))
	for i := range w1 {
		w1[i] = float32(limit * r.symmetric())
	}
	limit = math.Sqrt(6 / float64(c.Hidden+c.Classes))
	for i := range w2 {
		w2[i] = float32(limit * r.symmetric())
	}
	return params
}

// split cuts a flat parameter (or gradient) vector into its tensors.
func split[T any](c Config, v []T) (w1, b1, w2, b2 []T) {
	w1, v = v[:c.Features*c.Hidden], v[c.Features*c.Hidden:]
	b1, v = v[:c.Hidden], v[c.Hidden:]
	w2, v = v[:c.Hidden*c.Classes], v[c.Hidden*c.Classes:]
	return w1, b1, w2, v[:c.Classes]
}

func (p *Problem) split(v []float32) (w1, b1, w2, b2 []float32) { return split(p.cfg, v) }
