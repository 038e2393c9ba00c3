// Package kubedriver is the autoscaler's pool driver for Kubernetes: the runtime pool is a
// Deployment, grown and shrunk through its scale subresource (`fanin autoscaler --driver
// kubernetes`). It is a package of its own so that only the programs that drive Kubernetes link
// client-go: the autoscaler, the gateway, fanin dev and their tests do not.
package kubedriver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"

	"github.com/fanin-ml/fanin/autoscaler"
)

// DeletionCostAnnotation is the pod annotation the ReplicaSet controller reads to choose which pods
// to delete when it scales down: lower cost goes first.
const DeletionCostAnnotation = "controller.kubernetes.io/pod-deletion-cost"

// removeDeletionCost is the cost Remove gives the pod it removes: the lowest an int32 allows, so no
// other pod of the pool (default cost 0) ranks below it.
const removeDeletionCost = "-2147483648"

// ErrDeploymentNotFound is returned when the runtime Deployment does not exist in its namespace.
var ErrDeploymentNotFound = errors.New("kubernetes: runtime deployment not found")

// ForbiddenError says which call the Kubernetes API refused by RBAC: the autoscaler's Role lacks Verb
// on Resource (deploy/kubernetes/autoscaler.yaml grants what the driver uses).
type ForbiddenError struct {
	Verb      string // get, update, patch, list, delete
	Resource  string // e.g. deployments/scale, pods
	Namespace string
	Name      string // the object, empty for a list
	Err       error  // the API's answer
}

func (e *ForbiddenError) Error() string {
	obj := e.Resource
	if e.Name != "" {
		obj += " " + e.Name
	}
	return fmt.Sprintf("kubernetes: forbidden to %s %s in namespace %s: the autoscaler's Role needs verb %q on %q: %v",
		e.Verb, obj, e.Namespace, e.Verb, e.Resource, e.Err)
}

func (e *ForbiddenError) Unwrap() error { return e.Err }

// Driver sizes the runtime pool as the replicas of a Deployment whose pods run `fanin
// runtime --id $(POD_NAME)`: a runtime's id is its pod's name. Scale and Remove change the replicas
// through the Deployment's scale subresource (what `kubectl scale` and the HorizontalPodAutoscaler
// use), read-modify-write with the resourceVersion, retried on conflict, so a concurrent writer is
// never overwritten blindly.
//
// Remove(id) cannot tell the ReplicaSet controller which pod to delete directly: a Deployment scales
// down by deleting the pods it ranks lowest. So it annotates that pod with the lowest
// pod-deletion-cost and then lowers the replicas by one; the ReplicaSet controller deletes that pod
// (SIGTERM: the runtime checkpoints and releases its shards within the pod's
// terminationGracePeriodSeconds). The alternative, deleting the pod and then lowering the replicas,
// races the ReplicaSet controller, which may start a replacement pod in between only to delete it
// again. The deletion cost only ranks pods the controller finds otherwise equal, though: unscheduled,
// pending and unready pods go before it. When such another pod exists, Remove deletes the named pod
// itself and then lowers the replicas; a replacement the ReplicaSet controller may start in between
// is unscheduled and pending, and the other pods of that lowest rank get deletion cost 1 first, so
// the replacement (cost 0) is the pod that goes. A pod that is gone or already terminating is not
// removed twice: scaling down for it would take another, working runtime.
//
// Size is the Deployment's desired replicas as last read or written. It is not watched: Scale reads
// the scale subresource again when its cached value is older than the refresh interval (default 10s),
// and the controller calls Scale every decision interval, so the value follows outside changes
// (kubectl scale) within about that interval, and Scale costs no request in between unless it grows
// the pool.
type Driver struct {
	client     kubernetes.Interface
	namespace  string
	deployment string
	log        *slog.Logger
	refresh    time.Duration
	now        func() time.Time

	op sync.Mutex // serializes Scale and Remove, so a Remove is not carried out twice for one pod

	mu       sync.Mutex // guards replicas, readAt, removed
	replicas int
	readAt   time.Time
	removed  map[string]time.Time // pods Remove scaled down for, until seen gone (time of the Remove)
}

// Option configures a Driver.
type Option func(*Driver) error

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(d *Driver) error { d.log = l; return nil }
}

// WithRefresh sets how old the cached replicas may be before Scale reads them again
// (default 10s).
func WithRefresh(every time.Duration) Option {
	return func(d *Driver) error {
		if every <= 0 {
			return fmt.Errorf("refresh interval must be > 0, got %v", every)
		}
		d.refresh = every
		return nil
	}
}

// New returns a driver for the Deployment namespace/deployment. It reads the
// Deployment's scale once, so a missing Deployment (ErrDeploymentNotFound) or a Role that cannot
// read it (*ForbiddenError) is reported at start. Options: WithLogger,
// WithRefresh.
func New(ctx context.Context, client kubernetes.Interface, namespace, deployment string, opts ...Option) (*Driver, error) {
	if namespace == "" || deployment == "" {
		return nil, errors.New("kubernetes driver: namespace and deployment are required")
	}
	d := &Driver{
		client: client, namespace: namespace, deployment: deployment,
		log: slog.Default(), refresh: 10 * time.Second, now: time.Now,
		removed: map[string]time.Time{},
	}
	for _, o := range opts {
		if err := o(d); err != nil {
			return nil, err
		}
	}
	if _, err := d.getScale(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// TemplateSized reports true: the Deployment's pod template sizes a runtime (its CPU request,
// which the runtime reports as its cores), not the policy's cores_per_runtime.
func (d *Driver) TemplateSized() bool { return true }

var _ autoscaler.PoolDriver = (*Driver)(nil)

// Scale raises the Deployment's replicas to n if they are lower; it never lowers them.
func (d *Driver) Scale(ctx context.Context, n int) error {
	d.op.Lock()
	defer d.op.Unlock()
	d.mu.Lock()
	fresh := d.now().Sub(d.readAt) < d.refresh
	cached := d.replicas
	d.mu.Unlock()
	if fresh && n <= cached {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := d.getScale(ctx)
		if err != nil {
			return err
		}
		if int(s.Spec.Replicas) >= n {
			return nil
		}
		from := s.Spec.Replicas
		s.Spec.Replicas = int32(n)
		if _, err := d.updateScale(ctx, s); err != nil {
			return err
		}
		d.log.Info("runtime deployment scaled up", "deployment", d.namespace+"/"+d.deployment, "from", from, "to", n)
		return nil
	})
}

// Remove stops the runtime running in pod id: the ReplicaSet controller deletes that pod (SIGTERM)
// and the replicas drop by one. A pod that does not exist, is terminating already or is not one of
// the Deployment's is left alone and nil returned, like ProcessDriver does for a process it does not
// know. It does not wait for the pod to terminate.
func (d *Driver) Remove(ctx context.Context, id string) (err error) {
	d.op.Lock()
	defer d.op.Unlock()
	pod, err := d.client.CoreV1().Pods(d.namespace).Get(ctx, id, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		d.forget(id)
		d.log.Info("runtime pod to remove is gone already", "pod", id)
		return nil
	}
	if err != nil {
		return d.apiErr(err, "get", "pods", id)
	}
	if pod.DeletionTimestamp != nil {
		d.forget(id)
		d.log.Info("runtime pod to remove is terminating already", "pod", id)
		return nil
	}
	if d.removing(id) {
		return nil // replicas lowered for it already; the ReplicaSet controller has not deleted it yet
	}
	s, err := d.getScale(ctx)
	if err != nil {
		return err
	}
	sel, err := labels.Parse(s.Status.Selector)
	if err != nil || s.Status.Selector == "" || !sel.Matches(labels.Set(pod.Labels)) {
		d.log.Warn("pod to remove is not one of the runtime deployment's; left alone", "pod", id,
			"deployment", d.namespace+"/"+d.deployment, "selector", s.Status.Selector)
		return nil
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, DeletionCostAnnotation, removeDeletionCost)
	if _, err := d.client.CoreV1().Pods(d.namespace).Patch(ctx, id, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return d.apiErr(err, "patch", "pods", id)
	}
	// Marked before the pod goes, so WatchVanished does not report it. If it does not go, it is
	// unmarked and its deletion cost taken back (best effort), so that a later scale-down, ours or
	// anyone's, does not take it by mistake.
	d.mu.Lock()
	d.removed[id] = d.now()
	d.mu.Unlock()
	deleted := false
	defer func() {
		if deleted || err == nil {
			return
		}
		d.forget(id)
		undo := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, DeletionCostAnnotation)
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, perr := d.client.CoreV1().Pods(d.namespace).Patch(uctx, id, types.MergePatchType, []byte(undo), metav1.PatchOptions{}); perr != nil {
			d.log.Warn("could not take back the deletion cost of a pod Remove failed for", "pod", id, "err", perr)
		}
	}()
	other, spare, err := d.rankedBelow(ctx, pod, sel)
	if err != nil {
		return err
	}
	if other != "" {
		// The deletion cost would not pick this pod. Delete it ourselves, then lower the replicas.
		// In between, the ReplicaSet controller may start a replacement, which is unscheduled and
		// pending, the lowest rank: give the other pods of that rank a higher cost than the
		// replacement's default 0 first, so the replacement is the one that goes.
		d.log.Info("deleting the runtime pod directly: another pod ranks below it for the ReplicaSet controller",
			"pod", id, "other", other, "protected", len(spare))
		keep := fmt.Sprintf(`{"metadata":{"annotations":{%q:"1"}}}`, DeletionCostAnnotation)
		for _, name := range spare {
			_, err := d.client.CoreV1().Pods(d.namespace).Patch(ctx, name, types.MergePatchType, []byte(keep), metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return d.apiErr(err, "patch", "pods", name)
			}
		}
		if err := d.client.CoreV1().Pods(d.namespace).Delete(ctx, id, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}); err != nil && !apierrors.IsNotFound(err) {
			return d.apiErr(err, "delete", "pods", id)
		}
		deleted = true
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := d.getScale(ctx)
		if err != nil {
			return err
		}
		if s.Spec.Replicas == 0 {
			return nil
		}
		s.Spec.Replicas--
		_, err = d.updateScale(ctx, s)
		return err
	})
	if err != nil {
		if deleted {
			// The pod is going: a retry of Remove is a no-op, and the next Scale may keep the
			// replacement. Say so rather than hide it.
			return fmt.Errorf("pod %s deleted, but lowering the replicas failed: %w", id, err)
		}
		return err
	}
	d.log.Info("runtime pod removed", "pod", id, "deployment", d.namespace+"/"+d.deployment, "replicas", d.Size())
	return nil
}

// rankedBelow returns the name of another active pod of the Deployment that the ReplicaSet
// controller would delete before pod whatever their deletion costs (unscheduled, earlier phase, or
// not ready while pod is ready), or "" if there is none; and the other active pods of the lowest
// rank (unscheduled, pending, not ready) whose deletion cost is not above 0.
func (d *Driver) rankedBelow(ctx context.Context, pod *corev1.Pod, sel labels.Selector) (other string, spare []string, err error) {
	list, err := d.client.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return "", nil, d.apiErr(err, "list", "pods", "")
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.UID == pod.UID || o.DeletionTimestamp != nil || o.Status.Phase == corev1.PodSucceeded || o.Status.Phase == corev1.PodFailed {
			continue
		}
		r := rankBeforeCost(o)
		if r < rankBeforeCost(pod) && other == "" {
			other = o.Name
		}
		cost := o.Annotations[DeletionCostAnnotation]
		if n, err := strconv.ParseInt(cost, 10, 32); r == 0 && cost != removeDeletionCost && (err != nil || n <= 0) {
			spare = append(spare, o.Name)
		}
	}
	return other, spare, nil
}

// rankBeforeCost orders pods as the ReplicaSet controller does before it looks at deletion costs
// (k8s.io/kubernetes pkg/controller ActivePodsWithRanks.Less): unassigned < assigned, then pending <
// unknown < running, then not ready < ready. Lower goes first.
func rankBeforeCost(p *corev1.Pod) int {
	r := 0
	if p.Spec.NodeName != "" {
		r += 100
	}
	switch p.Status.Phase {
	case corev1.PodUnknown:
		r += 10
	case corev1.PodRunning:
		r += 20
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			r++
		}
	}
	return r
}

// Size is the Deployment's desired replicas as last read or written.
func (d *Driver) Size() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.replicas
}

// removing reports whether Remove lowered the replicas for pod id already. Entries older than an
// hour are dropped: pod names are not reused, so the map only needs to outlive the pod's deletion.
func (d *Driver) removing(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for p, at := range d.removed {
		if d.now().Sub(at) > time.Hour {
			delete(d.removed, p)
		}
	}
	_, ok := d.removed[id]
	return ok
}

func (d *Driver) forget(id string) {
	d.mu.Lock()
	delete(d.removed, id)
	d.mu.Unlock()
}

func (d *Driver) getScale(ctx context.Context) (*autoscalingv1.Scale, error) {
	s, err := d.client.AppsV1().Deployments(d.namespace).GetScale(ctx, d.deployment, metav1.GetOptions{})
	if err != nil {
		return nil, d.apiErr(err, "get", "deployments/scale", d.deployment)
	}
	d.cache(s)
	return s, nil
}

func (d *Driver) updateScale(ctx context.Context, s *autoscalingv1.Scale) (*autoscalingv1.Scale, error) {
	out, err := d.client.AppsV1().Deployments(d.namespace).UpdateScale(ctx, d.deployment, s, metav1.UpdateOptions{})
	if err != nil {
		return nil, d.apiErr(err, "update", "deployments/scale", d.deployment)
	}
	d.cache(out)
	return out, nil
}

func (d *Driver) cache(s *autoscalingv1.Scale) {
	d.mu.Lock()
	d.replicas, d.readAt = int(s.Spec.Replicas), d.now()
	d.mu.Unlock()
}

// apiErr turns the API's refusals into the driver's errors; the API's error stays wrapped, so
// apierrors.IsConflict and the like still see it (retry.RetryOnConflict relies on that).
func (d *Driver) apiErr(err error, verb, resource, name string) error {
	switch {
	case apierrors.IsForbidden(err):
		return &ForbiddenError{Verb: verb, Resource: resource, Namespace: d.namespace, Name: name, Err: err}
	case resource == "deployments/scale" && apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s/%s: %w", ErrDeploymentNotFound, d.namespace, d.deployment, err)
	case name == "":
		return fmt.Errorf("kubernetes: %s %s in namespace %s: %w", verb, resource, d.namespace, err)
	default:
		return fmt.Errorf("kubernetes: %s %s %s/%s: %w", verb, resource, d.namespace, name, err)
	}
}

// Client returns a client for the API server and the default namespace: from the
// kubeconfig file at path, or from $KUBECONFIG when path is empty, or else the in-cluster
// configuration of the pod's ServiceAccount (the namespace then is the pod's).
func Client(path string) (kubernetes.Interface, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules() // reads $KUBECONFIG
	rules.ExplicitPath = path
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	var cfg *rest.Config
	var err error
	if path == "" && os.Getenv(clientcmd.RecommendedConfigPathEnvVar) == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = cc.ClientConfig()
	}
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes client configuration: %w", err)
	}
	ns, _, err := cc.Namespace() // the context's, else the pod's (in cluster), else "default"
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes namespace: %w", err)
	}
	cfg.UserAgent = "fanin-autoscaler"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, "", err
	}
	return cs, ns, nil
}

// PodWatch is the handle of WatchVanished.
type PodWatch struct {
	cancel  context.CancelFunc
	factory informers.SharedInformerFactory
}

// Stop ends the watch and waits for its goroutines.
func (w *PodWatch) Stop() {
	w.cancel()
	w.factory.Shutdown()
}

// WatchVanished calls onVanished (from the watch's goroutine) with the name of every pod of the
// Deployment that ends without Remove having been asked for it: deleted (by then its containers
// have exited, or it never ran) or failed (evicted, say). A pod that is only terminating is not
// reported: it is still checkpointing. It returns once the watch has listed the pods; Stop ends it.
// It needs list and watch on pods.
func (d *Driver) WatchVanished(ctx context.Context, onVanished func(id string)) (*PodWatch, error) {
	s, err := d.getScale(ctx)
	if err != nil {
		return nil, err
	}
	if s.Status.Selector == "" {
		return nil, fmt.Errorf("kubernetes: deployment %s/%s has no selector in its scale status", d.namespace, d.deployment)
	}
	// The informer retries refusals forever, in its log: try both calls once to report them.
	opts := metav1.ListOptions{LabelSelector: s.Status.Selector, Limit: 1}
	if _, err := d.client.CoreV1().Pods(d.namespace).List(ctx, opts); err != nil {
		return nil, d.apiErr(err, "list", "pods", "")
	}
	one := int64(1)
	opts.Limit, opts.TimeoutSeconds = 0, &one
	wi, err := d.client.CoreV1().Pods(d.namespace).Watch(ctx, opts)
	if err != nil {
		return nil, d.apiErr(err, "watch", "pods", "")
	}
	wi.Stop()
	wctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactoryWithOptions(d.client, 0, informers.WithNamespace(d.namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.Status.Selector }))
	inf := f.Core().V1().Pods().Informer()
	report := func(name, why string) {
		if d.removing(name) {
			return
		}
		d.log.Warn("runtime pod vanished", "pod", name, "why", why)
		onVanished(name)
	}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Pod)
			c, ok2 := cur.(*corev1.Pod)
			if ok1 && ok2 && !ended(o) && ended(c) {
				report(c.Name, "phase "+string(c.Status.Phase))
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			p, ok := obj.(*corev1.Pod)
			if !ok {
				return
			}
			if !ended(p) {
				report(p.Name, "deleted")
			}
			d.forget(p.Name)
		},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	f.Start(wctx.Done())
	w := &PodWatch{cancel: cancel, factory: f}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		w.Stop()
		return nil, fmt.Errorf("kubernetes: listing the pods of %s/%s: %w", d.namespace, d.deployment, context.Cause(sctx))
	}
	return w, nil
}

// ended reports whether a pod's containers have all stopped for good.
func ended(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
}
