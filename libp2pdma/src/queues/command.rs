//! What a command says: I/O and admin commands, the PRPs built for them
//! from their payloads, and which admin commands the safe filter takes.

use super::{
    facts::NamespaceInfo,
    mapped::{Instance, Payload},
    qpair::LIST_ENTRIES,
};
use crate::{
    memory::peer::PeerAccess,
    nvme::{admin, io, Command, DataPtr, PAGE},
    Error, Result,
};

/// An NVM command: what, where, and the data.
#[derive(Clone, Copy, Debug)]
pub struct IoCommand<'a> {
    /// [`io::READ`], [`io::WRITE`] or [`io::FLUSH`].
    pub opcode: u8,
    /// Namespace.
    pub nsid: u32,
    /// First logical block.
    pub slba: u64,
    /// Logical blocks (1 to 65536; ignored by FLUSH). Times the block size,
    /// exactly the payload's length.
    pub blocks: u32,
    /// The data, for READ and WRITE.
    pub data: Option<Payload<'a>>,
}

impl<'a> IoCommand<'a> {
    /// A READ of `blocks` blocks at `slba` into `data`.
    pub fn read(nsid: u32, slba: u64, blocks: u32, data: Payload<'a>) -> Self {
        Self {
            opcode: io::READ,
            nsid,
            slba,
            blocks,
            data: Some(data),
        }
    }

    /// A WRITE of `blocks` blocks at `slba` from `data`.
    pub fn write(nsid: u32, slba: u64, blocks: u32, data: Payload<'a>) -> Self {
        Self {
            opcode: io::WRITE,
            ..Self::read(nsid, slba, blocks, data)
        }
    }

    /// A WRITE (with `write`) or a READ of `blocks` blocks at `slba`.
    pub fn data(write: bool, nsid: u32, slba: u64, blocks: u32, data: Payload<'a>) -> Self {
        match write {
            true => Self::write(nsid, slba, blocks, data),
            false => Self::read(nsid, slba, blocks, data),
        }
    }

    /// A FLUSH of namespace `nsid`.
    pub fn flush(nsid: u32) -> Self {
        Self {
            opcode: io::FLUSH,
            nsid,
            slba: 0,
            blocks: 0,
            data: None,
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self.opcode {
            io::READ => "READ",
            io::WRITE => "WRITE",
            io::FLUSH => "FLUSH",
            _ => "command",
        }
    }
}

/// An admin command that this library does not build itself (see
/// [`Controller::admin`](super::Controller::admin)): opcode, namespace, command dwords 10 to 15 and
/// the data, whose PRPs the library builds.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdminCommand<'a> {
    /// Opcode.
    pub opcode: u8,
    /// Namespace.
    pub nsid: u32,
    /// Command dwords 10 to 15.
    pub cdw: [u32; 6],
    /// The data, for a command that moves any.
    pub data: Option<Payload<'a>>,
}

/// Checks an NVM command against the namespace it names (as last
/// identified) and the controller's largest transfer, and builds its entry
/// and PRPs from its payload. Refuses anything the controller would move
/// to or from bytes outside the payload.
pub(crate) fn build_io(
    cmd: &IoCommand<'_>,
    ns: Option<&NamespaceInfo>,
    max_transfer: usize,
    ctrl: Instance,
) -> Result<(Command, Option<DataPtr>)> {
    let bad = |why: String| Err(Error::InvalidArgument(format!("{}: {why}", cmd.name())));
    let Some(ns) = ns else {
        return bad(format!(
            "namespace {} is not active on {}",
            cmd.nsid, ctrl.pci
        ));
    };
    if ns.metadata != 0 {
        return bad(format!(
            "namespace {} has {} bytes of metadata per block, which this driver does not transfer",
            ns.nsid, ns.metadata
        ));
    }
    match cmd.opcode {
        io::FLUSH => {
            if cmd.data.is_some() {
                return bad("a FLUSH moves no data".into());
            }
            return Ok((
                Command {
                    opcode: io::FLUSH,
                    nsid: cmd.nsid,
                    ..Default::default()
                },
                None,
            ));
        }
        io::READ | io::WRITE => {}
        op => return bad(format!("opcode {op:#04x} is not READ, WRITE or FLUSH")),
    }
    let Some(data) = cmd.data else {
        return bad("no data".into());
    };
    if cmd.blocks == 0 || cmd.blocks > 0x1_0000 {
        return bad(format!("{} blocks (1 to 65536)", cmd.blocks));
    }
    let bytes = u64::from(cmd.blocks) * u64::from(ns.block_size);
    if bytes != data.len as u64 {
        return bad(format!(
            "{} blocks of {} bytes are {bytes} bytes, but the payload holds {}",
            cmd.blocks, ns.block_size, data.len
        ));
    }
    if data.len > max_transfer {
        return bad(format!(
            "{} bytes in one command, more than the controller's largest transfer ({max_transfer})",
            data.len
        ));
    }
    if cmd
        .slba
        .checked_add(u64::from(cmd.blocks))
        .is_none_or(|end| end > ns.blocks)
    {
        return bad(format!(
            "blocks {}..+{} are past the end of namespace {} ({} blocks)",
            cmd.slba, cmd.blocks, ns.nsid, ns.blocks
        ));
    }
    if let Some(why) = ctrl.refuses(&data.map.ctrl) {
        return bad(why);
    }
    let (needs, what) = if cmd.opcode == io::READ {
        (PeerAccess::WriteOnly, "write")
    } else {
        (PeerAccess::ReadOnly, "read")
    };
    if data.map.access != PeerAccess::ReadWrite && data.map.access != needs {
        return bad(format!(
            "the payload is mapped {:?}, and the controller must {what} it",
            data.map.access
        ));
    }
    let prps = data.prps().map_err(Error::InvalidArgument)?;
    if prps.pages.len() > LIST_ENTRIES {
        return bad(format!(
            "{} PRP entries do not fit one list page",
            prps.pages.len()
        ));
    }
    Ok((
        Command {
            opcode: cmd.opcode,
            nsid: cmd.nsid,
            cdw: [
                cmd.slba as u32,
                (cmd.slba >> 32) as u32,
                cmd.blocks - 1,
                0,
                0,
                0,
            ],
            ..Default::default()
        },
        Some(prps),
    ))
}

/// The bytes an admin command that [`Controller::admin`] takes moves
/// (`None`: none), or why it does not take the command. An allow list:
/// the commands whose data size this library knows from the command and
/// that neither manage the queues, give the controller memory beyond the
/// command's life, change the namespaces commands are checked against, nor
/// hide the events that announce namespace changes.
pub(crate) fn admin_data_len(cmd: &AdminCommand<'_>) -> std::result::Result<Option<usize>, String> {
    let numd = |lo: u32, hi: u32| ((hi & 0xffff) << 16 | lo >> 16) as usize * 4 + 4;
    let raw = "; Controller::admin_raw takes it";
    let set = cmd.opcode == admin::SET_FEATURES;
    Ok(match cmd.opcode {
        admin::IDENTIFY => Some(PAGE),
        admin::GET_LOG_PAGE => {
            let retain = cmd.cdw[0] & 1 << 15 != 0;
            if cmd.cdw[0] & 0xff == admin::LOG_CHANGED_NAMESPACES && !retain {
                return Err(format!(
                    "reading the Changed Namespace List without Retain Asynchronous Event (CDW10 bit 15) takes the event that tells this library its namespaces changed{raw}"
                ));
            }
            Some(numd(cmd.cdw[0], cmd.cdw[1]))
        }
        admin::GET_FEATURES | admin::SET_FEATURES => match cmd.cdw[0] & 0xff {
            admin::FEATURE_NUM_QUEUES if set => {
                return Err("it changes the queues this library set up".into())
            }
            admin::FEATURE_ASYNC_EVENT_CONFIG if set => {
                return Err(format!(
                    "it can turn off the notices that tell this library its namespaces changed{raw}"
                ))
            }
            admin::FEATURE_HOST_MEMORY_BUFFER if set => {
                return Err("the Host Memory Buffer gives the controller memory to use for good".into())
            }
            // LBA Range Type, Host Memory Buffer attributes.
            0x03 | 0x0d => Some(PAGE),
            // Autonomous Power State Transition.
            0x0c => Some(256),
            // Timestamp.
            0x0e => Some(8),
            // Host Behavior Support.
            0x10 => Some(512),
            // Host Identifier: 128 bits when EXHID is set.
            0x81 => Some(if cmd.cdw[1] & 1 != 0 { 16 } else { 8 }),
            // Features held in the command and its completion.
            0x01 | 0x02 | 0x04..=0x0b | 0x0f | 0x11 | 0x80 => None,
            fid => {
                return Err(format!(
                    "feature {fid:#04x} may move data of a size this library does not know{raw}"
                ))
            }
        },
        admin::FIRMWARE_DOWNLOAD => Some((cmd.cdw[0] as usize + 1) * 4),
        admin::SECURITY_SEND | admin::SECURITY_RECEIVE => Some(cmd.cdw[1] as usize),
        admin::FIRMWARE_COMMIT | admin::DEVICE_SELF_TEST | admin::KEEP_ALIVE => None,
        admin::DELETE_IO_SQ
        | admin::CREATE_IO_SQ
        | admin::DELETE_IO_CQ
        | admin::CREATE_IO_CQ
        | admin::ABORT => return Err("it manages the queues this library set up".into()),
        admin::DOORBELL_BUFFER_CONFIG => {
            return Err("it gives the controller memory to write for good".into())
        }
        admin::FORMAT_NVM
        | admin::SANITIZE
        | admin::NAMESPACE_MANAGEMENT
        | admin::NAMESPACE_ATTACHMENT => {
            return Err("it changes namespaces that commands are checked against".into())
        }
        admin::ASYNC_EVENT_REQUEST => {
            return Err(format!(
                "its completion would take an event this library waits for (namespace changes among them){raw}"
            ))
        }
        op => {
            return Err(format!(
                "admin opcode {op:#04x} is not one whose data this library knows{raw}"
            ))
        }
    })
}
