package kubedriver_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/util/retry"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/fanin-ml/fanin/autoscaler/kubedriver"
	"github.com/fanin-ml/fanin/lab/image"
	"github.com/fanin-ml/fanin/lab/kubetest"
	"github.com/fanin-ml/fanin/lab/testutil"
)

const manifestDir = "../../deploy/kubernetes"

// driverCalls is every API call Driver makes: the Role in deploy/kubernetes must grant
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

// manifest is one YAML document of deploy/kubernetes.
type manifest struct {
	file string
	data []byte
}

// manifestDocs reads every document of deploy/kubernetes/*.yaml but the kustomization, the
// namespace first.
func manifestDocs(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "kustomization.yaml" })
	sort.Slice(files, func(i, j int) bool { // the namespace first
		return strings.HasSuffix(files[i], "namespace.yaml") && !strings.HasSuffix(files[j], "namespace.yaml")
	})
	var docs []manifest
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
			docs = append(docs, manifest{file: f, data: doc})
		}
	}
	return docs
}

// strictDecoder decodes into client-go's typed objects and fails on a field the type does not
// have or a field given twice, as the apiserver's strict field validation does.
var strictDecoder = serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()

// loadManifests decodes every object of deploy/kubernetes/*.yaml into its typed Go value.
func loadManifests(t *testing.T) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, d := range manifestDocs(t) {
		obj, gvk, err := strictDecoder.Decode(d.data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", d.file, err)
		}
		if m, ok := obj.(metav1.Object); ok && gvk.Kind != "Namespace" && m.GetNamespace() != "fanin" {
			t.Errorf("%s: %s %s is in namespace %q, want fanin", d.file, gvk.Kind, m.GetName(), m.GetNamespace())
		}
		objs = append(objs, obj)
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

// TestKubernetesManifests checks the manifests without a cluster: they decode strictly, the
// kustomization lists them all and sets the image every fanin container names, the runtime names
// itself after its pod, the autoscaler runs twice, and its Role grants exactly the driver's calls.
// (kube_nats_test.go checks the NATS cluster.)
func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	objs := loadManifests(t)

	var deployments []string
	for _, o := range objs {
		d, ok := o.(*appsv1.Deployment)
		if !ok {
			continue
		}
		deployments = append(deployments, d.Name)
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Image != image.Name {
				t.Errorf("Deployment %s container %s: image %q, want %q, the name kustomization.yaml and fanin-image use", d.Name, c.Name, c.Image, image.Name)
			}
		}
	}
	if want := []string{"fanin-autoscaler", "fanin-gateway", "fanin-runtime"}; !slices.Equal(slices.Sorted(slices.Values(deployments)), want) {
		t.Errorf("Deployments %v, want %v", deployments, want)
	}
	checkKustomization(t)
	checkSecured(t, objs)

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
	// A runtime reports (and runs) the cores it requested, not its node's: --cores and GOMAXPROCS
	// come from the container's requests.cpu in whole cores.
	if i := slices.Index(c.Args, "--cores"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != "$(RUNTIME_CORES)" {
		t.Errorf("runtime args %v: want --cores $(RUNTIME_CORES)", c.Args)
	}
	for _, name := range []string{"RUNTIME_CORES", "GOMAXPROCS"} {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 || c.Env[i].ValueFrom == nil || c.Env[i].ValueFrom.ResourceFieldRef == nil {
			t.Errorf("runtime: no %s from the downward API's resourceFieldRef", name)
			continue
		}
		r := c.Env[i].ValueFrom.ResourceFieldRef
		if r.ContainerName != c.Name || r.Resource != "requests.cpu" || r.Divisor.String() != "1" {
			t.Errorf("runtime %s from %s of %q divisor %s, want requests.cpu of %q divisor 1", name, r.Resource, r.ContainerName, r.Divisor.String(), c.Name)
		}
	}
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Error("runtime: no CPU request for --cores to come from")
	}
	if g := rt.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("runtime terminationGracePeriodSeconds = %v, want >= 30 for the checkpoint", g)
	}

	as := find[*appsv1.Deployment](t, objs, "fanin-autoscaler")
	if r := as.Spec.Replicas; r == nil || *r != 2 {
		t.Errorf("autoscaler replicas %v, want 2 (one leader, one standby)", r)
	}
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

// AuthSecret is the Secret that holds what `fanin auth init --dir DIR` writes to DIR, made by
// `kubectl create secret generic fanin-auth --from-file=DIR` (docs/KUBERNETES.md "Security").
const authSecret = "fanin-auth"

// secretFile says which key of which Secret the file at path is in container c of pod spec ps, or
// "", "" if no Secret volume mounted there provides it.
func secretFile(ps corev1.PodSpec, c corev1.Container, path string) (secret, key string) {
	for _, vm := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/")
		if !ok || vm.SubPath != "" {
			continue
		}
		i := slices.IndexFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		if i < 0 || ps.Volumes[i].Secret == nil {
			continue
		}
		sv := ps.Volumes[i].Secret
		if len(sv.Items) == 0 {
			if !strings.Contains(rel, "/") {
				return sv.SecretName, rel
			}
			continue
		}
		for _, it := range sv.Items {
			if it.Path == rel {
				return sv.SecretName, it.Key
			}
		}
	}
	return "", ""
}

// flagValue is the value after flag in args, or "".
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// checkSecured checks that the manifests deploy fanin's security: the gateway holds the authority
// directory (every file of the Secret at --auth-dir), the runtimes and the autoscaler connect with
// their own credentials from it, and the NATS servers include its nats-auth.conf (operator mode;
// kube_nats_test.go parses it). Without the Secret no fanin pod starts: there is no open mode.
func checkSecured(t *testing.T, objs []runtime.Object) {
	t.Helper()
	gw := find[*appsv1.Deployment](t, objs, "fanin-gateway").Spec.Template.Spec
	dir := flagValue(gw.Containers[0].Args, "--auth-dir")
	if dir == "" {
		t.Errorf("gateway args %v: no --auth-dir (per-job NATS credentials and accounts)", gw.Containers[0].Args)
	}
	for _, f := range []string{"operator.nk", "system.nk", "account.nk", "signer.nk", "admin.token", "gateway.creds"} {
		if s, k := secretFile(gw, gw.Containers[0], dir+"/"+f); s != authSecret || k != f {
			t.Errorf("gateway: %s/%s comes from Secret %q key %q, want %s key %s", dir, f, s, k, authSecret, f)
		}
	}
	for _, e := range gw.Containers[0].Env {
		if e.Name == "FANIN_TOKEN" {
			t.Errorf("gateway: FANIN_TOKEN set; the admin token is the authority's admin.token")
		}
	}
	for name, creds := range map[string]string{"fanin-runtime": "runtime.creds", "fanin-autoscaler": "autoscaler.creds"} {
		ps := find[*appsv1.Deployment](t, objs, name).Spec.Template.Spec
		path := flagValue(ps.Containers[0].Args, "--creds")
		if s, k := secretFile(ps, ps.Containers[0], path); s != authSecret || k != creds {
			t.Errorf("%s: --creds %q comes from Secret %q key %q, want %s key %s", name, path, s, k, authSecret, creds)
		}
	}
}

// checkKustomization checks that kustomization.yaml lists every other manifest of the directory
// and has an images: entry for image.Name; where kubectl is installed, that `kubectl kustomize`
// sets the image every fanin container pulls from that entry.
func checkKustomization(t *testing.T) {
	t.Helper()
	path := filepath.Join(manifestDir, "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type kustomizeImage struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		Digest  string `json:"digest"`
	}
	var k struct {
		APIVersion string           `json:"apiVersion"`
		Kind       string           `json:"kind"`
		Resources  []string         `json:"resources"`
		Images     []kustomizeImage `json:"images"`
	}
	if err := sigsyaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("%s: %s %s", path, k.APIVersion, k.Kind)
	}
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, want) {
		t.Errorf("%s lists %v, want every manifest of the directory %v", path, got, want)
	}
	if !slices.ContainsFunc(k.Images, func(i kustomizeImage) bool { return i.Name == image.Name }) {
		t.Errorf("%s has no images: entry named %q", path, image.Name)
	}

	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Log("kubectl not installed: kustomization.yaml not rendered")
		return
	}
	// A copy with the entry set as fanin-image --push prints it.
	dir := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			b = append(b, "    newName: registry.example/fanin\n    digest: sha256:"+strings.Repeat("ab", 32)+"\n"...)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	pinned := "image: registry.example/fanin@sha256:" + strings.Repeat("ab", 32)
	if n := strings.Count(string(out), pinned); n != 4 {
		t.Errorf("kubectl kustomize with the image set: %d containers say %q, want 4 (gateway, autoscaler, runtime, NATS):\n%s", n, pinned, out)
	}
}

// applyStrict creates the objects of the manifests as they are written, with the apiserver's
// strict field validation: a field the apiserver does not know, or one given twice, is an error
// (`kubectl apply --validate=strict`), which decoding into client-go's types would hide.
func applyStrict(t *testing.T, cfg *rest.Config, docs []manifest, dryRun bool) error {
	t.Helper()
	ctx := context.Background()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, d := range docs {
		js, err := sigsyaml.YAMLToJSONStrict(d.data)
		if err != nil {
			return fmt.Errorf("%s: %w", d.file, err)
		}
		var u unstructured.Unstructured
		if err := u.UnmarshalJSON(js); err != nil {
			return fmt.Errorf("%s: %w", d.file, err)
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", d.file, gvk, err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(u.GetNamespace())
		}
		if _, err := ri.Create(ctx, &u, opts); err != nil {
			return fmt.Errorf("%s: create %s %s: %w", d.file, gvk.Kind, u.GetName(), err)
		}
	}
	return nil
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

func newDriver(t *testing.T, cs kubernetes.Interface, ns string) *kubedriver.Driver {
	t.Helper()
	d, err := kubedriver.New(context.Background(), cs, ns, "fanin-runtime")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func without(names []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == name })
}

// TestKubernetesDriver runs Driver against a real kube-apiserver, etcd and
// kube-controller-manager (its deployment and replicaset controllers create and delete the pods;
// there is no scheduler or kubelet, so pods stay Pending). The manifests of deploy/kubernetes are
// applied first, and the driver runs as the autoscaler's ServiceAccount under its Role. Not
// parallel: the control plane listens on ports FreePort found free, which a test beside it could
// take in the seconds before they are bound.
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
	docs := manifestDocs(t)
	if err := applyStrict(t, cluster.Config(kubetest.AdminToken), docs, false); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("StrictValidation", func(t *testing.T) {
		// The apply above would have failed on a field the apiserver does not know: show it does,
		// with a misspelt field in the runtime Deployment (dry run). Typed decoding drops such a
		// field, and the apiserver's default validation only warns about it.
		var bad []manifest
		for _, d := range docs {
			if strings.Contains(string(d.data), "kind: Deployment") && strings.Contains(string(d.data), "name: fanin-runtime\n") {
				bad = append(bad, manifest{d.file, []byte(strings.Replace(string(d.data), "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:", 1))})
			}
		}
		if len(bad) != 1 || !strings.Contains(string(bad[0].data), "terminationGracePeriodSecond:") {
			t.Fatal("no runtime Deployment with terminationGracePeriodSeconds to misspell")
		}
		err := applyStrict(t, cluster.Config(kubetest.AdminToken), bad, true)
		if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), `unknown field "spec.template.spec.terminationGracePeriodSecond"`) {
			t.Fatalf("a misspelt field: %v, want the apiserver's 400 naming it", err)
		}
		t.Logf("refused: %v", err)
	})

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
		var d *kubedriver.Driver
		testutil.CheckFor(t, 10*time.Second, 100*time.Millisecond, func() error { // RBAC caches catch up
			var err error
			d, err = kubedriver.New(ctx, cluster.Client(t, restrictedToken), "fanin", "fanin-runtime")
			return err
		})
		err := d.Scale(ctx, d.Size()+1)
		var fe *kubedriver.ForbiddenError
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
		if c, ok := p.Annotations[kubedriver.DeletionCostAnnotation]; ok || p.DeletionTimestamp != nil {
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

		_, err = kubedriver.New(ctx, cluster.Client(t, nobodyToken), "fanin", "fanin-runtime")
		if !errors.As(err, &fe) || fe.Verb != "get" || fe.Resource != "deployments/scale" {
			t.Fatalf("a user without any Role: %v, want a ForbiddenError for get deployments/scale", err)
		}

		_, err = kubedriver.New(ctx, admin, "fanin", "no-such-deployment")
		if !errors.Is(err, kubedriver.ErrDeploymentNotFound) {
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
