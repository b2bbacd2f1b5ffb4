//! The container a server runs in, from its cgroup path, and its Kubernetes pod, from the container runtime's own
//! record of it: what the agent labels a server's series with, as the fleet profilers do.

use std::{fs, path::Path};

/// A container, and the pod it belongs to under Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    /// The runtime's 64-hex-digit id (Docker, containerd, CRI-O and Podman all name the cgroup with it).
    pub id: String,
    /// The pod's namespace and name, where the runtime records them.
    pub pod: Option<(String, String)>,
}

/// Where the container runtimes keep each container's configuration, `{}` standing for its id, and the
/// annotations (or labels) there that name its pod's namespace and name.
const RUNTIME_RECORDS: [(&str, &str, &str); 3] = [
    (
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/{}/config.json",
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
    ),
    (
        "/run/containers/storage/overlay-containers/{}/userdata/config.json",
        "io.kubernetes.pod.namespace",
        "io.kubernetes.pod.name",
    ),
    (
        "/var/lib/docker/containers/{}/config.v2.json",
        "io.kubernetes.pod.namespace",
        "io.kubernetes.pod.name",
    ),
];

impl Container {
    /// The container of process `pid`; `None` for a process in no container (or one whose cgroup names none).
    pub fn of(pid: u32) -> Option<Container> {
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let id = id_in_cgroups(&cgroup)?;
        let pod = RUNTIME_RECORDS.iter().find_map(|(path, namespace, name)| {
            let record = fs::read_to_string(path.replace("{}", &id)).ok()?;
            pod_in_record(&record, namespace, name)
        });
        Some(Container { id, pod })
    }
}

/// The container id in a `/proc/PID/cgroup`: the last path segment, of any hierarchy, that is 64 hex digits once
/// the runtimes' prefixes (`docker-`, `cri-containerd-`, `crio-`, `libpod-`) and `.scope` are taken off.
pub fn id_in_cgroups(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        // hierarchy-ID:controllers:path; the path may hold colons.
        let path = line.splitn(3, ':').nth(2)?;
        Path::new(path).iter().rev().find_map(|segment| {
            let segment = segment.to_str()?;
            let segment = segment.strip_suffix(".scope").unwrap_or(segment);
            let id = ["docker-", "cri-containerd-", "crio-", "libpod-"]
                .iter()
                .find_map(|p| segment.strip_prefix(p))
                .unwrap_or(segment);
            (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| id.to_ascii_lowercase())
        })
    })
}

/// The pod's namespace and name in a runtime's record of a container: its OCI annotations (containerd, CRI-O) or
/// its labels (Docker's `Config.Labels`).
fn pod_in_record(record: &str, namespace: &str, name: &str) -> Option<(String, String)> {
    let record: serde_json::Value = serde_json::from_str(record).ok()?;
    let pod = [&record["annotations"], &record["Config"]["Labels"]]
        .into_iter()
        .find_map(|map| {
            let ns = map[namespace].as_str()?;
            let pod = map[name].as_str()?;
            Some((ns.to_string(), pod.to_string()))
        });
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a9c1b7d5e4f60a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718";

    #[test]
    fn each_runtimes_cgroup_names_the_container() {
        for path in [
            format!("/docker/{ID}"),
            format!("/system.slice/docker-{ID}.scope"),
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c_3d4e.slice/cri-containerd-{ID}.scope"
            ),
            format!("/kubepods/besteffort/pod1b2c-3d4e/{ID}"),
            format!("/kubepods.slice/kubepods-pod1b2c.slice/crio-{ID}.scope"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
        ] {
            let cgroup = format!("12:pids:/\n0::{path}\n");
            assert_eq!(id_in_cgroups(&cgroup).as_deref(), Some(ID), "{path}");
        }
        assert_eq!(
            id_in_cgroups("0::/user.slice/user-0.slice/session-3.scope\n"),
            None
        );
        assert_eq!(id_in_cgroups("0::/\n"), None);
        assert_eq!(id_in_cgroups("garbage"), None);
    }

    #[test]
    fn the_pod_is_read_from_annotations_or_labels() {
        let containerd = r#"{"ociVersion":"1.1.0","annotations":{"io.kubernetes.cri.container-type":"container",
            "io.kubernetes.cri.sandbox-name":"db-0","io.kubernetes.cri.sandbox-namespace":"shop"}}"#;
        assert_eq!(
            pod_in_record(containerd, RUNTIME_RECORDS[0].1, RUNTIME_RECORDS[0].2),
            Some(("shop".into(), "db-0".into()))
        );
        let docker = r#"{"Config":{"Labels":{"io.kubernetes.pod.name":"db-1","io.kubernetes.pod.namespace":"shop"}}}"#;
        assert_eq!(
            pod_in_record(docker, RUNTIME_RECORDS[2].1, RUNTIME_RECORDS[2].2),
            Some(("shop".into(), "db-1".into()))
        );
        assert_eq!(pod_in_record("{}", "a", "b"), None);
        assert_eq!(pod_in_record("not json", "a", "b"), None);
    }
}
