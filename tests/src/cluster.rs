//! A real single-node cluster: etcd, kube-apiserver, kube-controller-manager,
//! kube-scheduler, containerd, kubelet and kube-proxy, with bridge pod
//! networking and Services, running the project's own images.
//!
//! Everything runs inside private Linux namespaces (PID, mount, network, UTS)
//! held by one process, so a cluster leaves nothing behind on the host: when the
//! namespace's first process dies (with the test process, through
//! `PR_SET_PDEATHSIG` and `unshare --kill-child`), the kernel kills every process
//! in it, containers and shims included, and drops its mounts, its network
//! devices (bridge, veths, the host's link to the node) and its iptables rules.
//! The only host state is one cgroup folder per controller, removed on drop and
//! swept at the next start when a killed run left it behind.
//!
//! The host reaches the node over a veth pair: the API server listens on the
//! node address, which is also the `kubernetes` Service's endpoint for pods.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::process::{Process, wait_for};
use crate::{repo_root, scratch_dir};

/// The node's name (and hostname inside the namespaces).
pub const NODE_NAME: &str = "testbed-node";
/// Pod addresses (bridge `cni0`, host-local IPAM).
const POD_SUBNET: &str = "10.244.0.0/24";
/// Service ClusterIPs; the first is the `kubernetes` Service.
const SERVICE_SUBNET: &str = "10.96.0.0/16";
const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// Image the kubelet asks containerd to run as each pod's sandbox.
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";
/// Cgroup folders of test-bed nodes start with this (see [`sweep_cgroups`]).
const CGROUP_PREFIX: &str = "placement-testbed-";

/// Folder holding the node components, `pause` and `helm` (`scripts/testbed
/// cluster-assets`, or `PLACEMENT_CLUSTER_BIN`).
pub fn cluster_assets() -> &'static Path {
    static ASSETS: OnceLock<PathBuf> = OnceLock::new();
    ASSETS.get_or_init(|| {
        if let Ok(dir) = std::env::var("PLACEMENT_CLUSTER_BIN") {
            return PathBuf::from(dir);
        }
        let output = Command::new(repo_root().join("scripts/testbed"))
            .arg("cluster-assets")
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/testbed cluster-assets");
        assert!(
            output.status.success(),
            "scripts/testbed cluster-assets failed"
        );
        PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
    })
}

pub(crate) fn node_bin(name: &str) -> PathBuf {
    let path = cluster_assets().join(name);
    assert!(
        path.exists(),
        "{} is missing; run scripts/testbed cluster-assets",
        path.display()
    );
    path
}

/// Folder of the OCI archives written by `scripts/images` (`PLACEMENT_IMAGES`,
/// default `target/images`).
pub fn images_dir() -> PathBuf {
    std::env::var_os("PLACEMENT_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join("target"))
                .join("images")
        })
}

/// A host program the cluster needs (from Debian's packages, installed by
/// `scripts/testbed host-packages`).
fn host_tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!("{name} is not installed; run scripts/testbed host-packages (as root)")
}

/// The namespaces of the node, held open by one process.
struct NodeNamespaces {
    /// `unshare ... -- pause`: its child (the `pause` process) is PID 1 of the
    /// node's PID namespace.
    holder: Process,
    /// PID (in the host's view) of the node's PID 1, the target of `nsenter`.
    init_pid: u32,
}

impl NodeNamespaces {
    fn create(dir: &Path) -> NodeNamespaces {
        let holder = Process::spawn(
            "node-namespaces",
            &host_tool("unshare"),
            &[
                "--pid".into(),
                "--fork".into(),
                "--kill-child".into(),
                "--mount".into(),
                "--propagation=private".into(),
                "--mount-proc".into(),
                "--net".into(),
                "--uts".into(),
                node_bin("pause").display().to_string(),
            ],
            &dir.join("namespaces.log"),
        )
        .expect("start unshare");
        let holder_pid = holder.pid().expect("unshare pid");
        let init_pid = wait_for(
            "the node's PID 1 (pause) to start",
            Duration::from_secs(10),
            || {
                let children = std::fs::read_to_string(format!(
                    "/proc/{holder_pid}/task/{holder_pid}/children"
                ))
                .ok()?;
                let pid: u32 = children.split_whitespace().next()?.parse().ok()?;
                // After the fork, the child runs unshare's code until it execs pause.
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
                (exe.file_name()? == "pause").then_some(pid)
            },
        );
        NodeNamespaces { holder, init_pid }
    }

    /// `nsenter` into every namespace of the node, running `program` with
    /// `PR_SET_PDEATHSIG` so it dies with the `nsenter` that started it.
    fn command_args(&self, program: &Path, args: &[String]) -> Vec<String> {
        let mut all = vec![
            format!("--target={}", self.init_pid),
            "--mount".into(),
            "--net".into(),
            "--pid".into(),
            "--uts".into(),
            "--".into(),
            host_tool("setpriv").display().to_string(),
            "--pdeathsig=KILL".into(),
            "--".into(),
            program.display().to_string(),
        ];
        all.extend(args.iter().cloned());
        all
    }
}

/// One component process of the node, with its log and what started it
/// (to start it again after [`Cluster::stop_component`]).
struct Component {
    name: &'static str,
    process: Process,
    program: PathBuf,
    args: Vec<String>,
    /// Stopped on purpose: not an error that it has exited.
    stopped: bool,
    starts: u32,
}

pub struct Cluster {
    dir: PathBuf,
    /// Killed before `namespaces`; in start order.
    components: Mutex<Vec<Component>>,
    namespaces: NodeNamespaces,
    /// Node address: the API server, the kubelet and NodePorts listen here.
    pub node_ip: Ipv4Addr,
    /// The host's end of the link to the node.
    pub host_ip: Ipv4Addr,
    cgroup_root: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("node_ip", &self.node_ip)
            .finish_non_exhaustive()
    }
}

/// Identities of the cluster's components (static tokens).
const IDENTITIES: [(&str, &str, &str); 5] = [
    ("admin", "admin", "system:masters"),
    ("controller-manager", "system:kube-controller-manager", ""),
    ("scheduler", "system:kube-scheduler", ""),
    ("kubelet", "system:node:testbed-node", "system:nodes"),
    ("kube-proxy", "system:kube-proxy", ""),
];

impl Cluster {
    /// One cluster shared by the tests of a test binary (each test uses its own
    /// namespaces). Started on first use; it ends with the test process.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Result<Cluster, String>> = OnceLock::new();
        crate::shared(&SHARED, "cluster", Cluster::start)
    }

    /// Start a cluster and wait until its node is Ready and its controllers work.
    pub fn start() -> Cluster {
        crate::install_crypto();
        sweep_cgroups();
        let dir = scratch_dir("cluster");
        let namespaces = NodeNamespaces::create(&dir);
        let (host_ip, node_ip) = link_addresses(namespaces.init_pid);
        let cluster = Cluster {
            cgroup_root: format!("{CGROUP_PREFIX}{}", namespaces.init_pid),
            dir,
            components: Mutex::new(Vec::new()),
            namespaces,
            node_ip,
            host_ip,
        };
        cluster.prepare_node();
        cluster.write_credentials();
        cluster.start_control_plane();
        cluster.start_node();
        cluster.wait_ready();
        cluster
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// PID (in the host's view) of the node's PID 1: its namespaces are those
    /// of `/proc/<pid>/ns/*`.
    pub fn init_pid(&self) -> u32 {
        self.namespaces.init_pid
    }

    /// Name of the host's end of the link to the node.
    pub fn host_interface(&self) -> String {
        host_interface(self.namespaces.init_pid)
    }

    pub fn server_url(&self) -> String {
        format!("https://{}:6443", self.node_ip)
    }

    /// The administrator's kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig-admin")
    }

    /// The administrator's kube client (bound to the calling test's runtime).
    pub async fn client(&self) -> kube::Client {
        crate::control_plane::kube_client(&self.kubeconfig()).await
    }

    /// The CA that signed the API server's serving certificate (PEM file).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The administrator's bearer token (`system:masters`).
    pub fn admin_token(&self) -> String {
        token("admin")
    }

    /// Run a command in the node's namespaces and wait for it.
    fn node_exec(&self, program: &Path, args: &[&str]) -> Output {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        Command::new(host_tool("nsenter"))
            .args(self.namespaces.command_args(program, &args))
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("nsenter {}: {e}", program.display()))
    }

    /// Like [`Cluster::node_exec`], panicking unless the command succeeds.
    fn node_exec_ok(&self, program: &Path, args: &[&str]) -> String {
        let out = self.node_exec(program, args);
        assert!(
            out.status.success(),
            "{} {args:?} in the node failed: {}{}",
            program.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Start a long-running component in the node's namespaces.
    fn spawn_component(&self, name: &'static str, program: &Path, args: &[String]) {
        let process = self.spawn_in_node(name, program, args, &format!("{name}.log"));
        self.components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Component {
                name,
                process,
                program: program.to_owned(),
                args: args.to_vec(),
                stopped: false,
                starts: 1,
            });
    }

    fn spawn_in_node(&self, name: &str, program: &Path, args: &[String], log: &str) -> Process {
        Process::spawn(
            name,
            &host_tool("nsenter"),
            &self.namespaces.command_args(program, args),
            &self.dir.join(log),
        )
        .unwrap_or_else(|e| panic!("start {name}: {e}"))
    }

    /// Stop a component (`kube-apiserver`, `kubelet`, ...) as a crash would:
    /// it stays down until [`Cluster::start_component`].
    pub fn stop_component(&self, name: &str) {
        let mut components = self.components.lock().unwrap_or_else(|p| p.into_inner());
        let component = components
            .iter_mut()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("the node runs no component {name}"));
        component.stopped = true;
        // SIGTERM ends `nsenter`, which forwards no signal; the component
        // dies with it through `setpriv --pdeathsig=KILL`.
        component.process.terminate(Duration::from_secs(20));
    }

    /// Start a stopped component again with the same flags (its log goes to
    /// `<name>-<n>.log`).
    pub fn start_component(&self, name: &str) {
        let mut components = self.components.lock().unwrap_or_else(|p| p.into_inner());
        let component = components
            .iter_mut()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("the node runs no component {name}"));
        assert!(component.stopped, "{name} is running; stop it first");
        component.starts += 1;
        let log = format!("{name}-{}.log", component.starts);
        component.process = self.spawn_in_node(name, &component.program, &component.args, &log);
        component.stopped = false;
    }

    /// Stop the node's kube-apiserver and wait until its port is closed (etcd,
    /// the kubelet and the pods keep running).
    pub fn stop_apiserver(&self) {
        self.stop_component("kube-apiserver");
        let address = std::net::SocketAddr::from((self.node_ip, 6443));
        wait_for(
            "the node's kube-apiserver port to close",
            Duration::from_secs(30),
            || {
                std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200))
                    .is_err()
                    .then_some(())
            },
        );
    }

    /// Start the node's kube-apiserver again and wait until it is ready.
    pub fn start_apiserver(&self) {
        self.start_component("kube-apiserver");
        self.wait_apiserver_ready();
    }

    fn wait_apiserver_ready(&self) {
        wait_for("kube-apiserver /readyz", Duration::from_secs(180), || {
            self.check_components();
            let out = self.kubectl(&["get", "--raw=/readyz"]);
            (out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok")
                .then_some(())
        });
    }

    /// Panic with the log's tail when a component has exited.
    fn check_components(&self) {
        let mut components = self.components.lock().unwrap_or_else(|p| p.into_inner());
        for component in components.iter_mut().filter(|c| !c.stopped) {
            assert!(
                !component.process.has_exited(),
                "{} exited:\n{}",
                component.name,
                component.process.log_tail(40)
            );
        }
    }

    /// Mounts, devices and kernel settings of the node, before anything runs.
    fn prepare_node(&self) {
        let state = self.dir.join("state");
        for sub in ["pod-logs", "container-logs", "cni-ipam", "cni-net.d"] {
            std::fs::create_dir_all(state.join(sub)).expect("create node state dir");
        }
        // Paths the kubelet, containerd and the CNI plugins use without a flag to
        // move them: private to the node through its mount namespace.
        let script = format!(
            r#"set -eu
hostname {NODE_NAME}
for d in /run/containerd /run/netns /var/log/pods /var/log/containers; do mkdir -p "$d"; done
mount -t tmpfs -o mode=0711 tmpfs /run/containerd
mount -t tmpfs -o mode=0755 tmpfs /run/netns
mount --bind {state}/pod-logs /var/log/pods
mount --bind {state}/container-logs /var/log/containers
ip link set lo up
echo 1 > /proc/sys/net/ipv4/ip_forward
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
"#,
            state = state.display()
        );
        self.node_exec_ok(&host_tool("sh"), &["-c", &script]);

        let host_if = self.host_interface();
        let ip = host_tool("ip");
        run_ok(
            &ip,
            &[
                "link",
                "add",
                &host_if,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &self.namespaces.init_pid.to_string(),
            ],
        );
        run_ok(
            &ip,
            &[
                "addr",
                "add",
                &format!("{}/30", self.host_ip),
                "dev",
                &host_if,
            ],
        );
        run_ok(&ip, &["link", "set", &host_if, "up"]);
        let script = format!(
            "set -eu\nip addr add {node}/30 dev eth0\nip link set eth0 up\nip route add default via {host}\n",
            node = self.node_ip,
            host = self.host_ip
        );
        self.node_exec_ok(&host_tool("sh"), &["-c", &script]);

        // The kubelet runs pods under this cgroup in every hierarchy.
        for hierarchy in cgroup_hierarchies() {
            let _ = std::fs::create_dir_all(hierarchy.join(&self.cgroup_root));
        }
    }

    /// CA, serving certificate, service-account key, tokens and kubeconfigs.
    fn write_credentials(&self) {
        let ca = placement_certs::Ca::generate("testbed-cluster-ca").expect("cluster CA");
        let serving = ca
            .issue_serving(&[
                self.node_ip.to_string(),
                KUBERNETES_SERVICE_IP.into(),
                "127.0.0.1".into(),
                "localhost".into(),
                "kubernetes".into(),
                "kubernetes.default".into(),
                "kubernetes.default.svc".into(),
                "kubernetes.default.svc.cluster.local".into(),
            ])
            .expect("apiserver serving certificate");
        write(&self.dir.join("ca.crt"), ca.cert_pem());
        write(&self.dir.join("apiserver.crt"), &serving.cert_pem);
        write(&self.dir.join("apiserver.key"), &serving.key_pem);
        let sa_key = rcgen::KeyPair::generate().expect("service account key");
        write(&self.dir.join("sa.key"), &sa_key.serialize_pem());
        write(&self.dir.join("sa.pub"), &sa_key.public_key_pem());
        let mut tokens = String::new();
        for (slug, user, group) in IDENTITIES {
            let token = token(slug);
            tokens.push_str(&if group.is_empty() {
                format!("{token},{user},{slug}-uid\n")
            } else {
                format!("{token},{user},{slug}-uid,\"{group}\"\n")
            });
            // Components inside the node reach the API server at the node's
            // address too.
            let server = self.server_url();
            write(
                &self.dir.join(format!("kubeconfig-{slug}")),
                &format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: testbed\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {slug}\n  user:\n    token: {token}\ncontexts:\n- name: testbed\n  context:\n    cluster: testbed\n    user: {slug}\ncurrent-context: testbed\n",
                    ca = self.dir.join("ca.crt").display(),
                ),
            );
        }
        write(&self.dir.join("tokens.csv"), &tokens);
    }

    fn start_control_plane(&self) {
        let dir = &self.dir;
        let p = |name: &str| dir.join(name).display().to_string();
        self.spawn_component(
            "etcd",
            &crate::peer("etcd"),
            &[
                "--name=default".into(),
                format!("--data-dir={}", p("etcd")),
                "--listen-client-urls=http://127.0.0.1:2379".into(),
                "--advertise-client-urls=http://127.0.0.1:2379".into(),
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-cluster=default=http://127.0.0.1:2380".into(),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        self.spawn_component(
            "kube-apiserver",
            &crate::peer("kube-apiserver"),
            &[
                format!("--advertise-address={}", self.node_ip),
                "--bind-address=0.0.0.0".into(),
                "--secure-port=6443".into(),
                "--etcd-servers=http://127.0.0.1:2379".into(),
                format!("--cert-dir={}", p("apiserver-certs")),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--token-auth-file={}", p("tokens.csv")),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                format!("--service-cluster-ip-range={SERVICE_SUBNET}"),
                "--allow-privileged=true".into(),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        );
        self.wait_apiserver_ready();
        self.spawn_component(
            "kube-controller-manager",
            &node_bin("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", p("kubeconfig-controller-manager")),
                format!(
                    "--authentication-kubeconfig={}",
                    p("kubeconfig-controller-manager")
                ),
                format!(
                    "--authorization-kubeconfig={}",
                    p("kubeconfig-controller-manager")
                ),
                "--bind-address=127.0.0.1".into(),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--service-cluster-ip-range={SERVICE_SUBNET}"),
                "--allocate-node-cidrs=false".into(),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
        );
        self.spawn_component(
            "kube-scheduler",
            &node_bin("kube-scheduler"),
            &[
                format!("--kubeconfig={}", p("kubeconfig-scheduler")),
                format!("--authentication-kubeconfig={}", p("kubeconfig-scheduler")),
                format!("--authorization-kubeconfig={}", p("kubeconfig-scheduler")),
                "--bind-address=127.0.0.1".into(),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ],
        );
    }

    fn start_node(&self) {
        let dir = &self.dir;
        let p = |name: &str| dir.join(name).display().to_string();
        let state = dir.join("state");
        let socket = dir.join("containerd.sock");
        write(
            &state.join("cni-net.d/10-testbed.conflist"),
            &serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "testbed",
                "plugins": [{
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": POD_SUBNET}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": state.join("cni-ipam"),
                    }
                }, {"type": "portmap", "capabilities": {"portMappings": true}}]
            })
            .to_string(),
        );
        write(
            &dir.join("containerd.toml"),
            &format!(
                r#"version = 2
root = "{root}"
state = "/run/containerd"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # These machines withhold CAP_SYS_RESOURCE: nothing may lower its oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{netd}"
  # No registry is reachable and every image is imported: a pull fails at once.
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."*"]
    endpoint = ["http://127.0.0.1:1"]
"#,
                root = p("containerd"),
                socket = socket.display(),
                netd = state.join("cni-net.d").display(),
            ),
        );
        self.spawn_component(
            "containerd",
            &host_tool("containerd"),
            &[format!("--config={}", p("containerd.toml"))],
        );
        wait_for("containerd to serve", Duration::from_secs(60), || {
            self.check_components();
            self.ctr(&["version"]).status.success().then_some(())
        });
        self.import_image(&self.pause_archive());
        write(
            &dir.join("kubelet.yaml"),
            &format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
failCgroupV1: false
failSwapOn: false
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization: {{mode: AlwaysAllow}}
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
# Imported images are the only images: never collect them; never evict on a
# small CI disk.
imageGCHighThresholdPercent: 100
evictionHard: {{memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}}
serializeImagePulls: false
nodeStatusReportFrequency: 10s
"#,
                socket = socket.display(),
                cgroup_root = self.cgroup_root,
            ),
        );
        self.spawn_component(
            "kubelet",
            &node_bin("kubelet"),
            &[
                format!("--config={}", p("kubelet.yaml")),
                format!("--kubeconfig={}", p("kubeconfig-kubelet")),
                format!("--root-dir={}", p("kubelet")),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={}", self.node_ip),
                "--v=1".into(),
            ],
        );
        write(
            &dir.join("kube-proxy.yaml"),
            &format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_SUBNET}
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# The node's network namespace is not the host's: leave the kernel's global
# conntrack settings alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
                kubeconfig = p("kubeconfig-kube-proxy"),
            ),
        );
        self.spawn_component(
            "kube-proxy",
            &node_bin("kube-proxy"),
            &[format!("--config={}", p("kube-proxy.yaml")), "--v=1".into()],
        );
    }

    /// The node is Ready, service accounts and the root CA are published, and
    /// the `kubernetes` Service answers from inside the node.
    fn wait_ready(&self) {
        wait_for("the node to be Ready", Duration::from_secs(180), || {
            self.check_components();
            let out = self.kubectl(&[
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            (String::from_utf8_lossy(&out.stdout).trim() == "True").then_some(())
        });
        wait_for(
            "the default service account and the root CA ConfigMap",
            Duration::from_secs(120),
            || {
                self.check_components();
                let sa = self.kubectl(&["get", "serviceaccount", "default", "-n", "default"]);
                let ca = self.kubectl(&["get", "configmap", "kube-root-ca.crt", "-n", "default"]);
                (sa.status.success() && ca.status.success()).then_some(())
            },
        );
    }

    /// `ctr` against the node's containerd, in the `k8s.io` namespace the CRI uses.
    pub fn ctr(&self, args: &[&str]) -> Output {
        let socket = self.dir.join("containerd.sock").display().to_string();
        let mut all = vec!["--address", socket.as_str(), "--namespace", "k8s.io"];
        all.extend_from_slice(args);
        self.node_exec(&host_tool("ctr"), &all)
    }

    /// Import an OCI archive (from `scripts/images`) into the node's containerd.
    pub fn import_image(&self, archive: &Path) {
        assert!(
            archive.exists(),
            "{} is missing: build the images first with scripts/images (scripts/test does)",
            archive.display()
        );
        let path = archive.display().to_string();
        let out = self.ctr(&["images", "import", &path]);
        assert!(
            out.status.success(),
            "import {path}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn pause_archive(&self) -> PathBuf {
        images_dir().join("pause.oci.tar")
    }

    /// Import every project image of `scripts/images` (webhook, sync, OPA).
    pub fn import_project_images(&self) {
        for name in ["placement-webhook", "placement-sync", "opa"] {
            self.import_image(&images_dir().join(format!("{name}.oci.tar")));
        }
    }

    /// Run kubectl as the administrator.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        crate::kubectl::kubectl(&self.kubeconfig(), args)
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        crate::kubectl::kubectl_ok(&self.kubeconfig(), args)
    }

    /// Run kubectl as the administrator, feeding `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        crate::kubectl::kubectl_stdin(&self.kubeconfig(), args, stdin)
    }

    /// Install the product as `kubectl apply -f deploy/` does (the chart's
    /// defaults, rendered), and wait until its Deployments have rolled out. The
    /// images must have been imported.
    pub fn install_deploy(&self) {
        let deploy = repo_root().join("deploy/placement-policy.yaml");
        self.kubectl_ok(&["apply", "-f", &deploy.display().to_string()]);
        for deployment in ["placement-policy-webhook", "placement-policy-remediator"] {
            self.wait_rollout("placement-system", deployment);
        }
        // Ready pods are not yet reachable through their Service until
        // kube-proxy has programmed it (a call before that is refused): wait
        // until the API server gets an answer from the webhook, any answer.
        let example = repo_root().join("examples/replicaset-eu-pci.yaml");
        let example = example.display().to_string();
        wait_for(
            "the webhook to answer through its Service",
            Duration::from_secs(60),
            || {
                let out = self.kubectl(&["create", "--dry-run=server", "-f", &example]);
                let stderr = String::from_utf8_lossy(&out.stderr);
                (!stderr.contains("failed calling webhook")).then_some(())
            },
        );
    }

    /// Wait until a Deployment has rolled out (every replica updated and Ready).
    pub fn wait_rollout(&self, namespace: &str, deployment: &str) {
        let out = self.kubectl(&[
            "rollout",
            "status",
            &format!("deployment/{deployment}"),
            "-n",
            namespace,
            "--timeout=300s",
        ]);
        assert!(
            out.status.success(),
            "{deployment} did not roll out: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
    }

    /// PIDs (host view) of the processes running `binary` (file name of their
    /// executable) in the containers of pod `namespace/name`.
    pub fn pod_processes(&self, namespace: &str, name: &str, binary: &str) -> Vec<u32> {
        let uid = self.kubectl_ok(&[
            "get",
            "pod",
            name,
            "-n",
            namespace,
            "-o",
            "jsonpath={.metadata.uid}",
        ]);
        // The kubelet (cgroupfs driver) runs a pod's containers in
        // `<cgroup root>/kubepods/<qos>/pod<uid>/<container>`.
        let marker = format!("pod{}", uid.trim());
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cgroups =
                    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
                cgroups.contains(&self.cgroup_root)
                    && cgroups.contains(&marker)
                    && exe.is_some_and(|exe| exe.file_name().is_some_and(|n| n == binary))
            })
            .collect()
    }

    /// Send `signal` to the processes of [`Cluster::pod_processes`]; returns how
    /// many got it.
    pub fn signal_pod_processes(
        &self,
        namespace: &str,
        name: &str,
        binary: &str,
        signal: i32,
    ) -> usize {
        let pids = self.pod_processes(namespace, name, binary);
        for pid in &pids {
            // SAFETY: kill(2) on a PID we just found; a stale PID only fails.
            unsafe {
                libc::kill(*pid as libc::pid_t, signal);
            }
        }
        pids.len()
    }

    /// Run the test bed's helm against this cluster.
    pub fn helm(&self, args: &[&str]) -> Output {
        Command::new(node_bin("helm"))
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            // helm's own state (plugins, repositories, cache) stays in the node's folder.
            .env("HELM_CACHE_HOME", self.dir.join("helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm/config"))
            .env("HELM_DATA_HOME", self.dir.join("helm/data"))
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .output()
            .expect("run helm")
    }

    /// helm that must succeed; returns stdout.
    pub fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.diagnostics()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The logs of the node's components and of every pod, for a failing test.
    pub fn diagnostics(&self) -> String {
        let mut text = String::new();
        let pods = self.kubectl(&["get", "pods", "-A", "-o", "wide"]);
        text.push_str(&String::from_utf8_lossy(&pods.stdout));
        let events = self.kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
        let events = String::from_utf8_lossy(&events.stdout);
        let lines: Vec<&str> = events.lines().collect();
        text.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
        text.push_str(&format!("\n(node logs in {})\n", self.dir.display()));
        text
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The kubelet and containerd first, so no new container starts while the
        // namespaces go away; then everything else with the namespace.
        let mut components = self.components.lock().unwrap_or_else(|p| p.into_inner());
        for component in components.iter_mut().rev() {
            component.process.kill();
        }
        self.namespaces.holder.kill();
        let init = self.namespaces.init_pid;
        // The kernel kills the rest of the PID namespace once its PID 1 is gone.
        let gone = (0..200).any(|_| {
            let alive = Path::new(&format!("/proc/{init}")).exists();
            if alive {
                std::thread::sleep(Duration::from_millis(50));
            }
            !alive
        });
        if gone {
            remove_cgroup(&self.cgroup_root);
        }
    }
}

/// The host's end of the link gets a name unique to the node.
fn host_interface(init_pid: u32) -> String {
    format!("pptb{init_pid}")
}

/// Addresses of the host/node link, a /30 in 10.253.0.0/16 derived from a PID
/// so that nodes started at the same time differ.
fn link_addresses(pid: u32) -> (Ipv4Addr, Ipv4Addr) {
    let index = pid % 16384;
    let base = u32::from(Ipv4Addr::new(10, 253, 0, 0)) + index * 4;
    (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
}

/// Mount points of the cgroup v1 hierarchies (or the one v2 hierarchy).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_owned()];
    }
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Remove a node's cgroup folders, deepest first (only empty cgroups can go).
fn remove_cgroup(name: &str) {
    fn remove_tree(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.filter_map(|e| e.ok()) {
                let path = entry.path();
                if path.is_dir() {
                    remove_tree(&path);
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for hierarchy in cgroup_hierarchies() {
        let dir = hierarchy.join(name);
        // Processes may take a moment to leave after the namespace is killed.
        for _ in 0..50 {
            remove_tree(&dir);
            if !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Remove what nodes whose PID 1 is gone (a killed run) left on the host: only
/// their cgroup folders, everything else went with their namespaces. Every
/// [`Cluster::start`] does this first.
pub fn sweep_cgroups() {
    let mut stale = std::collections::BTreeSet::new();
    for hierarchy in cgroup_hierarchies() {
        let Ok(entries) = std::fs::read_dir(&hierarchy) else {
            continue;
        };
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix(CGROUP_PREFIX)
                && !is_node_init(pid)
            {
                stale.insert(name);
            }
        }
    }
    for name in stale {
        remove_cgroup(&name);
    }
}

/// Whether `pid` is a running node's PID 1 (a `pause` process).
fn is_node_init(pid: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|exe| exe.file_name().is_some_and(|n| n == "pause"))
        .unwrap_or(false)
}

/// The static token of one of the cluster's identities.
fn token(slug: &str) -> String {
    format!("testbed-cluster-{slug}-token")
}

fn run_ok(program: &Path, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
