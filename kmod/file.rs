// SPDX-License-Identifier: GPL-2.0

//! `/dev/p2pdma`: the misc device and its ioctls.

use kernel::{
    fs::File,
    ioctl::{
        _IOC_SIZE,
        _IOR,
        _IOWR, //
    },
    miscdevice::{
        MiscDevice,
        MiscDeviceRegistration, //
    },
    prelude::*,
    transmute::{
        AsBytes,
        FromBytes, //
    },
    uaccess::{
        UserPtr,
        UserSlice, //
    },
};

use crate::{
    accel::DEVICES,
    uapi, //
};

// SAFETY: `repr(C)` structs of integers and integer arrays with explicit
// padding (layout pinned in uapi.rs): every bit pattern is valid and there are
// no padding bytes.
unsafe impl FromBytes for uapi::P2pdmaVersion {}
// SAFETY: See above.
unsafe impl AsBytes for uapi::P2pdmaVersion {}
// SAFETY: See above.
unsafe impl FromBytes for uapi::P2pdmaDeviceInfo {}
// SAFETY: See above.
unsafe impl AsBytes for uapi::P2pdmaDeviceInfo {}

// The shared ABI computes request codes itself; they must equal the kernel's.
const _: () = {
    assert!(
        uapi::P2PDMA_IOC_GET_VERSION
            == _IOR::<uapi::P2pdmaVersion>(uapi::P2PDMA_IOCTL_MAGIC, 0x00)
    );
    assert!(
        uapi::P2PDMA_IOC_DEVICE_INFO
            == _IOWR::<uapi::P2pdmaDeviceInfo>(uapi::P2PDMA_IOCTL_MAGIC, 0x01)
    );
};

/// State of one open `/dev/p2pdma` file.
pub(crate) struct P2pdmaFile;

#[vtable]
impl MiscDevice for P2pdmaFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        KBox::pin(P2pdmaFile, GFP_KERNEL).map_err(Into::into)
    }

    fn ioctl(_me: Pin<&P2pdmaFile>, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        let user = UserSlice::new(UserPtr::from_addr(arg), _IOC_SIZE(cmd));
        match cmd {
            uapi::P2PDMA_IOC_GET_VERSION => get_version(user),
            uapi::P2PDMA_IOC_DEVICE_INFO => device_info(user),
            _ => Err(ENOTTY),
        }?;
        Ok(0)
    }
}

fn get_version(user: UserSlice) -> Result {
    let out = uapi::P2pdmaVersion {
        abi_version: uapi::P2PDMA_ABI_VERSION,
        abi_min_compat: uapi::P2PDMA_ABI_MIN_COMPAT,
        capabilities: uapi::P2PDMA_CAP_BAR_P2PMEM,
        num_devices: DEVICES.lock().count() as u32,
        ..Default::default()
    };
    user.writer().write(&out)
}

fn device_info(user: UserSlice) -> Result {
    let (mut reader, mut writer) = user.reader_writer();
    let arg: uapi::P2pdmaDeviceInfo = reader.read()?;
    if arg.flags != 0 || arg.reserved != [0; 4] || arg.index >= uapi::P2PDMA_MAX_DEVICES {
        return Err(EINVAL);
    }
    let out = {
        let devices = DEVICES.lock();
        let dev = devices.get(arg.index as usize).ok_or(ENODEV)?;
        uapi::P2pdmaDeviceInfo {
            p2p_available: dev.info.p2p_size,
            ..dev.info
        }
    };
    writer.write(&out)
}
