//! The fixtures and helpers the tests of several formats share.

use super::{crash_site, identify, Elements, TextThread};

macro_rules! fixture {
    ($file:literal) => {
        include_str!(concat!("../../../tests/fixtures/stacks/text/", $file))
    };
}

pub(super) const SEGV_KILL: &str = fixture!("mariadb-10.11-sigsegv-kill.log");
pub(super) const SEGV_SLEEP: &str = fixture!("mariadb-10.11-sigsegv-sleep-thread.log");
pub(super) const ABRT_PROCEDURE: &str = fixture!("mariadb-10.11-sigabrt-procedure-thread.log");
pub(super) const SEGV_PREPARED: &str = fixture!("mariadb-10.11-sigsegv-prepared-thread.log");
pub(super) const SEGV_MULTILINE: &str = fixture!("mariadb-10.11-sigsegv-multiline-query.log");
pub(super) const MYSQL_9_7_PROCEDURE: &str = fixture!("mysql-9.7-sigsegv-procedure-thread.log");
pub(super) const GDB_TWO_THREADS: &str = fixture!("gdb-twothreads.txt");
pub(super) const GDB_IN_SIGNAL: &str = fixture!("gdb-insignal.txt");
pub(super) const GDB_MARIADBD: &str = fixture!("gdb-mariadbd.txt");
pub(super) const EU_STACK_MARIADBD: &str = fixture!("eu-stack-mariadbd.txt");
pub(super) const EU_STACK_M_MARIADBD: &str = fixture!("eu-stack-m-mariadbd.txt");
pub(super) const EU_STACK_AM_IN_SIGNAL: &str = fixture!("eu-stack-am-insignal.txt");
pub(super) const EU_STACK_VB_TWO_THREADS: &str = fixture!("eu-stack-vb-twothreads.txt");

pub(super) fn clean_names(thread: &TextThread) -> Vec<String> {
    thread
        .frames
        .iter()
        .map(|f| f.clean_function().unwrap_or_else(|| "??".to_string()))
        .collect()
}

pub(super) fn elements(thread: &TextThread) -> (Elements, Option<String>) {
    let names = clean_names(thread);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let site = crash_site(&names).map(|i| names[i].to_string());
    (identify(&names), site)
}
