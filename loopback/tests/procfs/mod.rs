//! What `/proc` says about this process's threads: the CPUs a task may run on and the task
//! directory of a thread by name, for the tests that pin the loopback device's engine.

#![allow(dead_code)]

/// The CPUs the task at `task_dir` (e.g. `/proc/thread-self`, `/proc/<pid>/task/<tid>`) may
/// run on, from its `status` file (`Cpus_allowed_list`, ranges like `0-3,8`).
pub(crate) fn allowed_cpus(task_dir: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("{task_dir}/status")).expect("procfs");
    let list = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().unwrap()..=b.parse::<u32>().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// The task directories of process `pid`'s threads (`self` for this one), with their names.
pub(crate) fn threads(pid: &str) -> Vec<(String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("procfs")
        .map(|entry| {
            let dir = entry.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            (dir.display().to_string(), comm.trim().to_string())
        })
        .collect()
}

/// The task directory of this process's thread named `name`.
pub(crate) fn thread_dir(name: &str) -> String {
    threads("self")
        .into_iter()
        .find_map(|(dir, comm)| (comm == name).then_some(dir))
        .unwrap_or_else(|| panic!("no thread named {name}"))
}
