package kubedriver_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fanin-ml/fanin/internal/auth"
	"github.com/fanin-ml/fanin/internal/store"
	"github.com/fanin-ml/fanin/lab/image"
	"github.com/fanin-ml/fanin/lab/testutil"
	"github.com/fanin-ml/fanin/wire"
)

// natsManifest is the NATS cluster of deploy/kubernetes/nats.yaml.
type natsManifest struct {
	sts      *appsv1.StatefulSet
	headless *corev1.Service // the StatefulSet's serviceName
	client   *corev1.Service // what fanin's components connect to
	conf     string          // nats.conf of the ConfigMap the pods mount
	podEnv   string          // the variable holding the pod's name
	authConf string          // where nats.conf's include finds nats-auth.conf, relative to nats.conf
	// authority stands for the Secret fanin-auth: its nats-auth.conf is what options puts where
	// nats.conf includes it.
	authority *auth.Authority
}

// natsConfDir is where the pods mount nats.conf.
const natsConfDir = "/etc/nats"

func loadNATSManifest(t *testing.T, objs []runtime.Object) natsManifest {
	t.Helper()
	m := natsManifest{sts: find[*appsv1.StatefulSet](t, objs, "nats"), client: find[*corev1.Service](t, objs, "nats")}
	m.headless = find[*corev1.Service](t, objs, m.sts.Spec.ServiceName)
	c := m.container(t)
	if !slices.Equal(c.Args, []string{"nats", "--config", natsConfDir + "/nats.conf"}) {
		t.Fatalf("nats args %q, want nats --config %s/nats.conf (fanin nats: nats-server)", c.Args, natsConfDir)
	}
	var cmName string
	for _, v := range m.sts.Spec.Template.Spec.Volumes {
		if v.ConfigMap != nil && slices.ContainsFunc(c.VolumeMounts, func(vm corev1.VolumeMount) bool { return vm.Name == v.Name && vm.MountPath == natsConfDir }) {
			cmName = v.ConfigMap.Name
		}
	}
	m.conf = find[*corev1.ConfigMap](t, objs, cmName).Data["nats.conf"]
	// Operator mode: nats.conf includes nats-auth.conf from the Secret fanin-auth (an include is
	// relative to the including file).
	for line := range strings.Lines(m.conf) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "include" {
			m.authConf = strings.Trim(f[1], `"'`)
		}
	}
	if m.authConf == "" {
		t.Fatalf("nats.conf includes no nats-auth.conf: the servers would run without operator mode:\n%s", m.conf)
	}
	if s, k := secretFile(m.sts.Spec.Template.Spec, c, natsConfDir+"/"+m.authConf); s != authSecret || k != "nats-auth.conf" {
		t.Fatalf("nats.conf includes %s/%s, which comes from Secret %q key %q; want %s key nats-auth.conf", natsConfDir, m.authConf, s, k, authSecret)
	}
	a, err := auth.New()
	if err != nil {
		t.Fatal(err)
	}
	m.authority = a
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			m.podEnv = e.Name
		}
	}
	if m.podEnv == "" {
		t.Fatal("nats: no variable with the pod's name from the downward API")
	}
	return m
}

func (m natsManifest) container(t *testing.T) corev1.Container {
	t.Helper()
	cs := m.sts.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("StatefulSet nats has %d containers, want 1", len(cs))
	}
	return cs[0]
}

func (m natsManifest) port(t *testing.T, name string) int {
	t.Helper()
	for _, p := range m.container(t).Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("nats has no container port %q", name)
	return 0
}

// pod is the name of the StatefulSet's pod i.
func (m natsManifest) pod(i int) string { return fmt.Sprintf("%s-%d", m.sts.Name, i) }

// options parses nats.conf with nats-server's own parser as the server of pod i reads it, with the
// pod's name in the environment as the kubelet puts it there, and the authority's nats-auth.conf
// where the Secret puts it, its resolver in resolverDir (fanin auth init --resolver-dir).
func (m natsManifest) options(t *testing.T, i int, resolverDir string) *server.Options {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(m.conf), 0o600); err != nil {
		t.Fatal(err)
	}
	authConf, err := m.authority.ServerConfig(resolverDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, m.authConf)), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, m.authConf), []byte(authConf), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, value := range m.env(t, i) {
		t.Setenv(name, value)
	}
	o, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats.conf as pod %s reads it: %v", m.pod(i), err)
	}
	return o
}

// podNode is the node that pod i runs on, in these tests.
func (m natsManifest) podNode(i int) string { return fmt.Sprintf("node-%d", i) }

// env is the environment of pod i's container as the kubelet makes it: the pod's name and its
// node's from the downward API, and values with $(VAR) references to the variables before them
// expanded.
func (m natsManifest) env(t *testing.T, i int) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range m.container(t).Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = m.pod(i)
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName":
			env[e.Name] = m.podNode(i)
		case e.ValueFrom != nil:
			t.Fatalf("nats: variable %s from %+v, which this test does not know", e.Name, e.ValueFrom)
		default:
			v := e.Value
			for name, value := range env {
				v = strings.ReplaceAll(v, "$("+name+")", value)
			}
			env[e.Name] = v
		}
	}
	return env
}

// routePod is the ordinal of the StatefulSet's pod that route u names through the headless
// Service, or an error.
func (m natsManifest) routePod(u *url.URL) (int, error) {
	suffix := "." + m.headless.Name + "." + m.sts.Namespace + ".svc"
	host := strings.TrimSuffix(u.Hostname(), ".cluster.local")
	pod, ok := strings.CutSuffix(host, suffix)
	if !ok {
		return 0, fmt.Errorf("route %s is not a pod of the headless Service (%s)", u, suffix)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(pod, m.sts.Name+"-"))
	if err != nil || m.pod(n) != pod || n >= int(*m.sts.Spec.Replicas) {
		return 0, fmt.Errorf("route %s names %s, not a pod of StatefulSet %s", u, pod, m.sts.Name)
	}
	return n, nil
}

// natsServerVersion is the version of nats-server that go.mod requires, e.g. "2.15.2": the
// server fanin embeds and its tests run.
func natsServerVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/nats-io/nats-server/v2" {
			return strings.TrimPrefix(f[1], "v")
		}
	}
	t.Fatal("go.mod does not require github.com/nats-io/nats-server/v2")
	return ""
}

// TestKubernetesNATSManifest checks the NATS cluster of the manifests without running it: three
// servers with JetStream, named after their pods, routed to each other through the headless
// Service, with fanin's payload limits, storage on the volume, the readiness probe on the
// monitoring port, a disruption budget of one, and the nats-server version fanin is built with.
// Not parallel: it reads nats.conf with the pod's name in the environment (options).
func TestKubernetesNATSManifest(t *testing.T) {
	objs := loadManifests(t)
	m := loadNATSManifest(t, objs)
	sts, c := m.sts, m.container(t)
	if r := sts.Spec.Replicas; r == nil || *r != 3 {
		t.Fatalf("StatefulSet nats replicas %v, want 3", r)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q, want Parallel", sts.Spec.PodManagementPolicy)
	}
	// fanin's image: `fanin nats` is the nats-server of go.mod, the version fanin's tests run.
	if c.Image != image.Name {
		t.Errorf("nats image %q, want %q (fanin nats, the nats-server %s of go.mod)", c.Image, image.Name, natsServerVersion(t))
	}
	podLabels := labels.Set(sts.Spec.Template.Labels)
	if h := m.headless; h.Spec.ClusterIP != corev1.ClusterIPNone || !h.Spec.PublishNotReadyAddresses || !labels.SelectorFromSet(h.Spec.Selector).Matches(podLabels) {
		t.Errorf("Service %s: clusterIP %q, publishNotReadyAddresses %v, selector %v; want a headless Service of the pods that publishes them before they are ready",
			h.Name, h.Spec.ClusterIP, h.Spec.PublishNotReadyAddresses, h.Spec.Selector)
	}
	if cl := m.client; cl.Spec.ClusterIP == corev1.ClusterIPNone || !labels.SelectorFromSet(cl.Spec.Selector).Matches(podLabels) ||
		len(cl.Spec.Ports) != 1 || cl.Spec.Ports[0].Port != int32(m.port(t, "client")) {
		t.Errorf("client Service %s: %+v", cl.Name, cl.Spec)
	}
	// fanin's components connect through the client Service.
	wantURL := fmt.Sprintf("nats://%s.%s.svc:%d", m.client.Name, m.client.Namespace, m.port(t, "client"))
	for _, o := range objs {
		if d, ok := o.(*appsv1.Deployment); ok {
			for _, e := range d.Spec.Template.Spec.Containers[0].Env {
				if e.Name == "NATS_URL" && e.Value != wantURL {
					t.Errorf("Deployment %s: NATS_URL %q, want %q", d.Name, e.Value, wantURL)
				}
			}
		}
	}
	// The runtimes try their own node's server first: a Service that reaches only the pods on the
	// client's node.
	local := find[*corev1.Service](t, objs, "nats-local")
	if p := local.Spec.InternalTrafficPolicy; p == nil || *p != corev1.ServiceInternalTrafficPolicyLocal ||
		!labels.SelectorFromSet(local.Spec.Selector).Matches(podLabels) || len(local.Spec.Ports) != 1 || local.Spec.Ports[0].Port != int32(m.port(t, "client")) {
		t.Errorf("Service nats-local: %+v, want the nats pods' client port with internalTrafficPolicy Local", local.Spec)
	}
	localURL := fmt.Sprintf("nats://%s.%s.svc:%d", local.Name, local.Namespace, m.port(t, "client"))
	rt := find[*appsv1.Deployment](t, objs, "fanin-runtime")
	if !slices.ContainsFunc(rt.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool { return e.Name == "FANIN_NATS_LOCAL" && e.Value == localURL }) {
		t.Errorf("Deployment fanin-runtime: no FANIN_NATS_LOCAL=%s", localURL)
	}
	pdb := find[*policyv1.PodDisruptionBudget](t, objs, "nats")
	if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.IntValue() != 1 || pdb.Spec.MinAvailable != nil || pdb.Spec.Selector == nil ||
		!labels.SelectorFromSet(pdb.Spec.Selector.MatchLabels).Matches(podLabels) {
		t.Errorf("PodDisruptionBudget nats: %+v, want maxUnavailable 1 of the nats pods", pdb.Spec)
	}
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz?js-enabled-only=true" || p.HTTPGet.Port.String() != "monitor" {
		t.Errorf("nats readiness probe %+v, want GET /healthz?js-enabled-only=true on monitor", p)
	}
	dataMount := ""
	for _, vm := range c.VolumeMounts {
		if len(sts.Spec.VolumeClaimTemplates) == 1 && vm.Name == sts.Spec.VolumeClaimTemplates[0].Name {
			dataMount = vm.MountPath
		}
	}

	for i := range int(*sts.Spec.Replicas) {
		o := m.options(t, i, filepath.Join(t.TempDir(), "accounts"))
		if o.AccountResolver != nil {
			o.AccountResolver.Close() // parsing started its store; no server will close it
		}
		if len(o.TrustedOperators) != 1 || o.SystemAccount == "" || o.AccountResolver == nil {
			t.Errorf("pod %s: %d trusted operators, system account %q, resolver %v; want operator mode with the full resolver",
				m.pod(i), len(o.TrustedOperators), o.SystemAccount, o.AccountResolver)
		}
		if o.ServerName != m.pod(i) {
			t.Errorf("pod %s: server_name %q, want the pod's name", m.pod(i), o.ServerName)
		}
		// Tagged with its node as the runtimes there name it (FANIN_NODE, spec.nodeName): the
		// streams that belong on a node are placed by it.
		if want := wire.NodeTag(m.podNode(i)); !slices.Contains([]string(o.Tags), want) {
			t.Errorf("pod %s on %s: server_tags %v, want %s", m.pod(i), m.podNode(i), o.Tags, want)
		}
		if !o.JetStream || o.StoreDir != dataMount {
			t.Errorf("pod %s: JetStream %v, store_dir %q; want JetStream on the volume claim at %q", m.pod(i), o.JetStream, o.StoreDir, dataMount)
		}
		if o.MaxPayload != 32<<20 || o.MaxPending != 1<<30 {
			t.Errorf("pod %s: max_payload %d, max_pending %d; want 32 MiB and 1 GiB (docs/PROTOCOL.md)", m.pod(i), o.MaxPayload, o.MaxPending)
		}
		if o.Port != m.port(t, "client") || o.HTTPPort != m.port(t, "monitor") || o.Cluster.Port != m.port(t, "cluster") || o.Cluster.Name == "" {
			t.Errorf("pod %s: ports client %d, monitor %d, cluster %d (named %q); the container's are %d, %d, %d",
				m.pod(i), o.Port, o.HTTPPort, o.Cluster.Port, o.Cluster.Name, m.port(t, "client"), m.port(t, "monitor"), m.port(t, "cluster"))
		}
		var routed []int
		for _, u := range o.Routes {
			n, err := m.routePod(u)
			if err != nil {
				t.Error(err)
				continue
			}
			if p, _ := strconv.Atoi(u.Port()); p != m.port(t, "cluster") {
				t.Errorf("route %s: port %d, want the cluster port %d", u, p, m.port(t, "cluster"))
			}
			routed = append(routed, n)
		}
		if slices.Sort(routed); !slices.Equal(routed, []int{0, 1, 2}) {
			t.Errorf("pod %s routes to pods %v, want 0, 1, 2", m.pod(i), routed)
		}
	}
}

// TestKubernetesNATSCluster runs the manifests' NATS configuration: nats.conf parsed for each of
// the three pods, moved to loopback ports and temporary stores (each route to the port of the pod
// it names), started as three servers of the nats-server fanin is built with. They form one
// JetStream cluster with a meta leader, the readiness probe's URL answers 200, and fanin's buckets
// get 3 replicas through a connection to one server (as through the client Service). Not
// parallel: the pod's name is in the environment (options).
func TestKubernetesNATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node NATS cluster")
	}
	m := loadNATSManifest(t, loadManifests(t))
	n := int(*m.sts.Spec.Replicas)
	ports := testutil.FreePorts(t, 3*n) // distinct: a port picked twice would fail a server's start
	routePorts := ports[:n]
	dir := t.TempDir()
	var opts []*server.Options
	for i := range n {
		o := m.options(t, i, filepath.Join(dir, m.pod(i), "accounts"))
		o.Host, o.Port = "127.0.0.1", ports[n+i]
		o.HTTPHost, o.HTTPPort = "127.0.0.1", ports[2*n+i]
		o.Cluster.Host, o.Cluster.Port = "127.0.0.1", routePorts[i]
		for _, u := range o.Routes {
			p, err := m.routePod(u)
			if err != nil {
				t.Fatal(err)
			}
			u.Host = fmt.Sprintf("127.0.0.1:%d", routePorts[p])
		}
		o.StoreDir = filepath.Join(dir, m.pod(i))
		o.NoLog, o.NoSigs = true, true
		opts = append(opts, o)
	}
	start := time.Now()
	cluster := testutil.StartClusterOf(t, opts)
	t.Logf("3 servers from nats.conf have a JetStream meta leader after %v", time.Since(start).Round(time.Millisecond))

	for i, o := range opts {
		if name := cluster.Node(i).Name(); name != m.pod(i) {
			t.Errorf("server %d is named %q, want %q", i, name, m.pod(i))
		}
		probe := fmt.Sprintf("http://127.0.0.1:%d%s", o.HTTPPort, m.container(t).ReadinessProbe.HTTPGet.Path)
		testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			resp, err := http.Get(probe)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s: %s", probe, resp.Status)
			}
			return nil
		})
	}

	url := fmt.Sprintf("nats://127.0.0.1:%d", opts[0].Port)
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("connected to the NATS cluster without credentials")
	}
	creds, err := m.authority.ComponentCredentials("fanin-test")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, creds.NATSOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.MaxPayload() != 32<<20 {
		t.Errorf("max payload %d, want 32 MiB", nc.MaxPayload())
	}
	testutil.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if r := store.StateReplicas(nc); r != 3 {
			return fmt.Errorf("StateReplicas = %d through one server (knows %v), want 3", r, nc.Servers())
		}
		return nil
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.OpenBuckets(ctx, js); err != nil {
		t.Fatal(err)
	}
	buckets := 0
	lister := js.KeyValueStores(ctx)
	for st := range lister.Status() {
		buckets++
		info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
		if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			t.Errorf("bucket %s: %d replicas, cluster %+v; want 3 on 3 servers", st.Bucket(), info.Config.Replicas, info.Cluster)
		}
	}
	if err := lister.Error(); err != nil {
		t.Fatal(err)
	}
	if buckets == 0 {
		t.Fatal("no buckets")
	}
	t.Logf("%d fanin buckets with 3 replicas", buckets)
}
