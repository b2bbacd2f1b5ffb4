//! Where a server's threads keep the statement they run, for the collectors that label their samples by statement
//! (`collect::labels`): the thread's connection object through the server's thread-local `current_thd`, at the
//! offset its exported accessor reads it from; the statement's fields at the offsets the connection's [`Layout`]
//! knows; and, for a connection seen, its user and database read from its object.

use std::{collections::HashMap, fs, sync::Mutex};

use anyhow::{Context, Result};

use super::{user_and_db, Layout};
use crate::{
    collect::labels::{BpfLayout, StatementSource},
    process::{
        self,
        memory::{self, Memory, ProcMemory, ThreadLocal},
    },
};

/// The servers' statements as their memory holds them; each process's layout read once.
#[derive(Default)]
pub struct StatementsInMemory {
    processes: Mutex<HashMap<u32, (Layout, ProcMemory)>>,
}

impl StatementsInMemory {
    pub fn boxed() -> Box<dyn StatementSource> {
        Box::<StatementsInMemory>::default()
    }
}

impl StatementSource for StatementsInMemory {
    fn layout(&self, pid: u32) -> Result<BpfLayout> {
        let target = process::resolve(Some(pid), true)?;
        anyhow::ensure!(
            target.flavor.is_server(),
            "{target} is not a MySQL or MariaDB server"
        );
        let server = target.flavor.server();
        let layout = Layout::of_process(pid, &target.binary, server)?;
        let fields = layout.statement_fields().context(
            "the server exports no function that reads when a connection's statement began",
        )?;
        let file = fs::File::open(&target.binary)
            .with_context(|| format!("opening {}", target.binary.display()))?;
        let current = server.sessions().current;
        let memory = ProcMemory::open(pid)?;
        let thd_tpoff = match memory::thread_local_pointer(&file, current)? {
            Some(ThreadLocal::At(offset)) => offset,
            // Initial-exec: the dynamic linker wrote the offset to the slot at load.
            Some(ThreadLocal::Slot(slot)) => {
                let bias = memory::load_bias(pid, &file)
                    .context("where the process maps its binary is not known")?;
                memory
                    .u64_at(bias.wrapping_add(slot))
                    .context("the offset of a thread's connection is not readable")?
                    as i64
            }
            None => anyhow::bail!(
                "its {current} reads no thread-local: where a thread's connection is, is not known"
            ),
        };
        let narrow = |v: u64| u32::try_from(v).context("a connection's field is past 4 GiB");
        let bpf = BpfLayout {
            thd_tpoff,
            id_offset: narrow(fields.id.0)?,
            id_width: fields.id.1 as u32,
            query_offset: narrow(fields.query)?,
            started_offset: narrow(fields.started)?,
        };
        self.processes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, (layout, memory));
        Ok(bpf)
    }

    fn user_and_db(&self, pid: u32, thd: u64, id: u64) -> Option<(Option<String>, Option<String>)> {
        let processes = self.processes.lock().unwrap_or_else(|e| e.into_inner());
        let (layout, memory) = processes.get(&pid)?;
        user_and_db(memory, layout, thd, id)
    }
}
