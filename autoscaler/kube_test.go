package autoscaler_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/retry"

	"github.com/fanin-ml/fanin/autoscaler"
	"github.com/fanin-ml/fanin/internal/kubetest"
	"github.com/fanin-ml/fanin/internal/testutil"
)

const manifestDir = "../deploy/kubernetes"

// driverCalls is every API call KubernetesDriver makes: the Role in deploy/kubernetes must grant
// them all, and nothing more.
var driverCalls = []struct{ group, resource, verb string }{
	{"apps", "deployments/scale", "get"},
	{"apps", "deployments/scale", "update"},
	{"", "pods", "get"},
	{"", "pods", "list"},
	{"", "pods", "watch"},
	{"", "pods", "patch"},
	{"", "pods", "delete"},
}

// loadManifests decodes every object of deploy/kubernetes/*.yaml into its typed Go value.
func loadManifests(t *testing.T) []runtime.Object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	sort.Slice(files, func(i, j int) bool { // the namespace first
		return strings.HasSuffix(files[i], "namespace.yaml") && !strings.HasSuffix(files[j], "namespace.yaml")
	})
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if m, ok := obj.(metav1.Object); ok && gvk.Kind != "Namespace" && m.GetNamespace() != "fanin" {
				t.Errorf("%s: %s %s is in namespace %q, want fanin", f, gvk.Kind, m.GetName(), m.GetNamespace())
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

func find[T runtime.Object](t *testing.T, objs []runtime.Object, name string) T {
	t.Helper()
	for _, o := range objs {
		if v, ok := o.(T); ok && o.(metav1.Object).GetName() == name {
			return v
		}
	}
	var zero T
	t.Fatalf("no %T named %s in %s", zero, name, manifestDir)
	return zero
}

// TestKubernetesManifests checks the manifests without a cluster: they decode, the runtime names
// itself after its pod, and the autoscaler's Role grants exactly the driver's calls.
func TestKubernetesManifests(t *testing.T) {
	objs := loadManifests(t)

	rt := find[*appsv1.Deployment](t, objs, "fanin-runtime")
	c := rt.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, "--id") || c.Args[slices.Index(c.Args, "--id")+1] != "$(POD_NAME)" {
		t.Errorf("runtime args %v: want --id $(POD_NAME)", c.Args)
	}
	podName := false
	for _, e := range c.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			podName = true
		}
	}
	if !podName {
		t.Error("runtime: no POD_NAME from the downward API's metadata.name")
	}
	if g := rt.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("runtime terminationGracePeriodSeconds = %v, want >= 30 for the checkpoint", g)
	}

	as := find[*appsv1.Deployment](t, objs, "fanin-autoscaler")
	args := strings.Join(as.Spec.Template.Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--driver kubernetes") || !strings.Contains(args, "--deployment fanin-runtime") {
		t.Errorf("autoscaler args %q: want --driver kubernetes --deployment fanin-runtime", args)
	}
	if sa := as.Spec.Template.Spec.ServiceAccountName; sa != "fanin-autoscaler" {
		t.Errorf("autoscaler ServiceAccount %q", sa)
	}
	binding := find[*rbacv1.RoleBinding](t, objs, "fanin-autoscaler")
	if binding.RoleRef.Name != "fanin-autoscaler" || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "fanin-autoscaler" {
		t.Errorf("RoleBinding %+v does not bind Role fanin-autoscaler to ServiceAccount fanin-autoscaler", binding)
	}

	role := find[*rbacv1.Role](t, objs, "fanin-autoscaler")
	granted := map[string]bool{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					granted[g+"/"+res+"/"+v] = true
				}
			}
		}
	}
	for _, c := range driverCalls {
		k := c.group + "/" + c.resource + "/" + c.verb
		if !granted[k] {
			t.Errorf("Role fanin-autoscaler does not grant %s", k)
		}
		delete(granted, k)
	}
	for k := range granted {
		t.Errorf("Role fanin-autoscaler grants %s, which the driver does not use", k)
	}
}

// apply creates the objects, as `kubectl create -f` would.
func apply(t *testing.T, cs kubernetes.Interface, objs []runtime.Object) {
	t.Helper()
	ctx := context.Background()
	for _, o := range objs {
		var err error
		switch v := o.(type) {
		case *corev1.Namespace:
			_, err = cs.CoreV1().Namespaces().Create(ctx, v, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = cs.CoreV1().ConfigMaps(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = cs.CoreV1().Services(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = cs.AppsV1().Deployments(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		case *appsv1.StatefulSet:
			_, err = cs.AppsV1().StatefulSets(v.Namespace).Create(ctx, v, metav1.CreateOptions{})
		default:
			t.Fatalf("apply: no case for %T", o)
		}
		if err != nil {
			t.Fatalf("apply %T %s: %v", o, o.(metav1.Object).GetName(), err)
		}
	}
}

// activePods lists the runtime pods not being deleted, sorted by name.
func activePods(ctx context.Context, cs kubernetes.Interface, ns string) ([]string, error) {
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=fanin-runtime"})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			names = append(names, p.Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// settled waits until the Deployment wants replicas and the ReplicaSet controller has made exactly
// that many active pods, and returns their names.
func settled(t *testing.T, cs kubernetes.Interface, ns string, replicas int) []string {
	t.Helper()
	ctx := context.Background()
	var pods []string
	testutil.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		dep, err := cs.AppsV1().Deployments(ns).Get(ctx, "fanin-runtime", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if int(*dep.Spec.Replicas) != replicas || dep.Status.ObservedGeneration < dep.Generation || int(dep.Status.Replicas) != replicas {
			return fmt.Errorf("deployment: spec %d, status %d (generation %d observed %d), want %d",
				*dep.Spec.Replicas, dep.Status.Replicas, dep.Generation, dep.Status.ObservedGeneration, replicas)
		}
		if pods, err = activePods(ctx, cs, ns); err != nil {
			return err
		}
		if len(pods) != replicas {
			return fmt.Errorf("%d active pods %v, want %d", len(pods), pods, replicas)
		}
		return nil
	})
	return pods
}

// runtimeIn creates namespace ns with a copy of the manifests' runtime Deployment at replicas.
func runtimeIn(t *testing.T, cs kubernetes.Interface, objs []runtime.Object, ns string, replicas int32) {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dep := find[*appsv1.Deployment](t, objs, "fanin-runtime").DeepCopy()
	dep.Namespace, dep.Spec.Replicas = ns, &replicas
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func newDriver(t *testing.T, cs kubernetes.Interface, ns string) *autoscaler.KubernetesDriver {
	t.Helper()
	d, err := autoscaler.NewKubernetesDriver(context.Background(), cs, ns, "fanin-runtime")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func without(names []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name })
}

// TestKubernetesDriver runs KubernetesDriver against a real kube-apiserver, etcd and
// kube-controller-manager (its deployment and replicaset controllers create and delete the pods;
// there is no scheduler or kubelet, so pods stay Pending). The manifests of deploy/kubernetes are
// applied first, and the driver runs as the autoscaler's ServiceAccount under its Role.
func TestKubernetesDriver(t *testing.T) {
	bins := kubetest.BinDir(t)
	objs := loadManifests(t)
	const saToken, restrictedToken, nobodyToken = "sa-token", "restricted-token", "nobody-token"
	cluster := kubetest.Start(t, bins, kubetest.Options{
		ControllerManager: true,
		Users: []kubetest.User{
			kubetest.ServiceAccount("fanin", "fanin-autoscaler", saToken),
			{Name: "restricted", Token: restrictedToken, Groups: []string{"system:authenticated"}},
			{Name: "nobody", Token: nobodyToken, Groups: []string{"system:authenticated"}},
		},
	})
	admin := cluster.Client(t, kubetest.AdminToken)
	apply(t, admin, objs)
	ctx := context.Background()

	t.Run("ScaleAndRemoveAsServiceAccount", func(t *testing.T) {
		d := newDriver(t, cluster.Client(t, saToken), "fanin")
		var vanished names
		w, err := d.WatchVanished(ctx, vanished.add)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		if d.Size() != 1 {
			t.Fatalf("Size = %d, want the manifest's 1", d.Size())
		}
		if err := d.Scale(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if d.Size() != 3 {
			t.Fatalf("Size = %d after Scale(3)", d.Size())
		}
		pods := settled(t, admin, "fanin", 3)
		if err := d.Scale(ctx, 2); err != nil || d.Size() != 3 {
			t.Fatalf("Scale(2) with 3 replicas: err %v, Size %d; Scale never shrinks", err, d.Size())
		}

		target := pods[1]
		if err := d.Remove(ctx, target); err != nil {
			t.Fatal(err)
		}
		if d.Size() != 2 {
			t.Fatalf("Size = %d after Remove", d.Size())
		}
		left := settled(t, admin, "fanin", 2)
		if want := without(pods, target); !slices.Equal(left, want) {
			t.Fatalf("after Remove(%s) the pods are %v, want %v: the ReplicaSet controller deleted another pod", target, left, want)
		}
		// Removing it again must not take another pod.
		if err := d.Remove(ctx, target); err != nil {
			t.Fatal(err)
		}
		if left := settled(t, admin, "fanin", 2); !slices.Equal(left, without(pods, target)) {
			t.Fatalf("a second Remove(%s) changed the pods to %v", target, left)
		}
		if got := vanished.list(); len(got) != 0 {
			t.Fatalf("WatchVanished reported %v; the removed pod did not vanish unasked", got)
		}

		// A pod deleted by someone else vanished: reported, and replaced by the ReplicaSet controller.
		gone := without(pods, target)[0]
		if err := admin.CoreV1().Pods("fanin").Delete(ctx, gone, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			if got := vanished.list(); !slices.Equal(got, []string{gone}) {
				return fmt.Errorf("vanished %v, want [%s]", got, gone)
			}
			return nil
		})
		if left := settled(t, admin, "fanin", 2); slices.Contains(left, gone) || d.Size() != 2 {
			t.Fatalf("pods %v, Size %d after %s was deleted", left, d.Size(), gone)
		}
	})

	t.Run("RemoveUnknownIsNoop", func(t *testing.T) {
		runtimeIn(t, admin, objs, "noop", 2)
		d := newDriver(t, admin, "noop")
		pods := settled(t, admin, "noop", 2)
		if err := d.Remove(ctx, "no-such-pod"); err != nil {
			t.Fatalf("Remove of a missing pod: %v", err)
		}
		stranger := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "stranger", Labels: map[string]string{"app": "other"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		if _, err := admin.CoreV1().Pods("noop").Create(ctx, stranger, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove(ctx, "stranger"); err != nil {
			t.Fatalf("Remove of a pod outside the Deployment: %v", err)
		}
		if d.Size() != 2 {
			t.Fatalf("Size = %d", d.Size())
		}
		if left := settled(t, admin, "noop", 2); !slices.Equal(left, pods) {
			t.Fatalf("pods %v, want %v", left, pods)
		}
		if _, err := admin.CoreV1().Pods("noop").Get(ctx, "stranger", metav1.GetOptions{}); err != nil {
			t.Fatalf("the stranger pod: %v", err)
		}
		// Two Removes of one pod before the ReplicaSet controller acts lower the replicas once.
		if err := d.Remove(ctx, pods[0]); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove(ctx, pods[0]); err != nil {
			t.Fatal(err)
		}
		if left := settled(t, admin, "noop", 1); !slices.Equal(left, pods[1:]) {
			t.Fatalf("pods %v, want %v", left, pods[1:])
		}
	})

	t.Run("RemoveScheduledPod", func(t *testing.T) {
		// The ReplicaSet controller deletes unscheduled pods before scheduled ones whatever their
		// deletion cost. Bind the target to a node so the other pods rank below it: Remove must
		// still take the target, by deleting it itself.
		runtimeIn(t, admin, objs, "bound", 3)
		d := newDriver(t, admin, "bound")
		pods := settled(t, admin, "bound", 3)
		target := pods[2]
		binding := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: target}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-a"}}
		if err := admin.CoreV1().Pods("bound").Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := d.Remove(ctx, target); err != nil {
			t.Fatal(err)
		}
		if left := settled(t, admin, "bound", 2); !slices.Equal(left, pods[:2]) {
			t.Fatalf("after Remove(%s) the pods are %v, want %v", target, left, pods[:2])
		}
		p, err := admin.CoreV1().Pods("bound").Get(ctx, target, metav1.GetOptions{})
		if err == nil && p.DeletionTimestamp == nil {
			t.Fatalf("%s is not being deleted", target)
		}
	})

	t.Run("ConflictRetry", func(t *testing.T) {
		runtimeIn(t, admin, objs, "conflict", 1)
		// Another writer (kubectl scale, say) changes the replicas between the driver's read and its
		// write: the apiserver answers 409 Conflict, and the driver reads again.
		var interlope atomic.Pointer[func()]
		var conflicts atomic.Int32
		cfg := cluster.Config(kubetest.AdminToken)
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
			return roundTripFunc(func(r *http.Request) (*http.Response, error) {
				if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/deployments/fanin-runtime/scale") {
					if f := interlope.Swap(nil); f != nil {
						(*f)()
					}
				}
				resp, err := rt.RoundTrip(r)
				if err == nil && resp.StatusCode == http.StatusConflict {
					conflicts.Add(1)
				}
				return resp, err
			})
		}
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d := newDriver(t, cs, "conflict")
		setReplicas := func(n int32) *func() {
			f := func() {
				// The other writer retries too: the deployment controller's status writes change the
				// resourceVersion that the scale subresource shares with the Deployment.
				err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
					s, err := admin.AppsV1().Deployments("conflict").GetScale(ctx, "fanin-runtime", metav1.GetOptions{})
					if err != nil {
						return err
					}
					s.Spec.Replicas = n
					_, err = admin.AppsV1().Deployments("conflict").UpdateScale(ctx, "fanin-runtime", s, metav1.UpdateOptions{})
					return err
				})
				if err != nil {
					t.Error(err)
				}
			}
			return &f
		}

		interlope.Store(setReplicas(2))
		if err := d.Scale(ctx, 4); err != nil {
			t.Fatal(err)
		}
		// At least one conflict: the deployment controller's status writes can add more.
		if conflicts.Load() < 1 || d.Size() != 4 {
			t.Fatalf("Scale(4) with a writer setting 2: %d conflicts, Size %d; want >= 1 and 4", conflicts.Load(), d.Size())
		}
		before := conflicts.Load()
		pods := settled(t, admin, "conflict", 4)

		// Remove lowers the replicas the other writer set (6 -> 5), not the ones it read (4 -> 3).
		interlope.Store(setReplicas(6))
		if err := d.Remove(ctx, pods[0]); err != nil {
			t.Fatal(err)
		}
		if conflicts.Load() <= before || d.Size() != 5 {
			t.Fatalf("Remove with a writer setting 6: %d more conflicts, Size %d; want >= 1 and 5", conflicts.Load()-before, d.Size())
		}
		left := settled(t, admin, "conflict", 5)
		if slices.Contains(left, pods[0]) {
			t.Fatalf("%s still there: %v", pods[0], left)
		}
	})

	t.Run("Errors", func(t *testing.T) {
		// A Role like the manifest's but without update on deployments/scale.
		role := find[*rbacv1.Role](t, objs, "fanin-autoscaler").DeepCopy()
		role.Name, role.ResourceVersion = "read-only-scale", ""
		for i := range role.Rules {
			if slices.Contains(role.Rules[i].Resources, "deployments/scale") {
				role.Rules[i].Verbs = []string{"get"}
			}
		}
		if _, err := admin.RbacV1().Roles("fanin").Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "read-only-scale"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: role.Name},
			Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "restricted"}},
		}
		if _, err := admin.RbacV1().RoleBindings("fanin").Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var d *autoscaler.KubernetesDriver
		testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error { // RBAC caches catch up
			var err error
			d, err = autoscaler.NewKubernetesDriver(ctx, cluster.Client(t, restrictedToken), "fanin", "fanin-runtime")
			return err
		})
		err := d.Scale(ctx, d.Size()+1)
		var fe *autoscaler.ForbiddenError
		if !errors.As(err, &fe) || fe.Verb != "update" || fe.Resource != "deployments/scale" {
			t.Fatalf("Scale without update on deployments/scale: %v, want a ForbiddenError for update deployments/scale", err)
		}
		t.Logf("the error: %v", err)

		// Remove sets the pod's deletion cost, is refused the scale-down, and takes the cost back.
		pods, err := activePods(ctx, admin, "fanin")
		if err != nil || len(pods) == 0 {
			t.Fatalf("pods %v: %v", pods, err)
		}
		err = d.Remove(ctx, pods[0])
		if !errors.As(err, &fe) || fe.Verb != "update" || fe.Resource != "deployments/scale" {
			t.Fatalf("Remove without update on deployments/scale: %v", err)
		}
		p, err := admin.CoreV1().Pods("fanin").Get(ctx, pods[0], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if c, ok := p.Annotations[autoscaler.DeletionCostAnnotation]; ok || p.DeletionTimestamp != nil {
			t.Fatalf("after a failed Remove the pod has deletion cost %q (set: %v), deleting: %v", c, ok, p.DeletionTimestamp != nil)
		}

		// The same Role without watch on pods: WatchVanished says so.
		for i := range role.Rules {
			if slices.Contains(role.Rules[i].Resources, "pods") {
				role.Rules[i].Verbs = slices.DeleteFunc(slices.Clone(role.Rules[i].Verbs), func(v string) bool { return v == "watch" })
			}
		}
		if _, err := admin.RbacV1().Roles("fanin").Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error {
			w, err := d.WatchVanished(ctx, func(string) {})
			if err == nil {
				w.Stop()
				return errors.New("WatchVanished without watch on pods succeeded")
			}
			if !errors.As(err, &fe) || fe.Verb != "watch" || fe.Resource != "pods" {
				t.Fatalf("WatchVanished without watch on pods: %v, want a ForbiddenError for watch pods", err)
			}
			return nil
		})

		_, err = autoscaler.NewKubernetesDriver(ctx, cluster.Client(t, nobodyToken), "fanin", "fanin-runtime")
		if !errors.As(err, &fe) || fe.Verb != "get" || fe.Resource != "deployments/scale" {
			t.Fatalf("a user without any Role: %v, want a ForbiddenError for get deployments/scale", err)
		}

		_, err = autoscaler.NewKubernetesDriver(ctx, admin, "fanin", "no-such-deployment")
		if !errors.Is(err, autoscaler.ErrDeploymentNotFound) {
			t.Fatalf("a missing Deployment: %v, want ErrDeploymentNotFound", err)
		}
	})
}

// names collects the ids a callback is given.
type names struct {
	mu  sync.Mutex // guards ids
	ids []string
}

func (n *names) add(id string) {
	n.mu.Lock()
	n.ids = append(n.ids, id)
	n.mu.Unlock()
}

func (n *names) list() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.ids)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
