//! A pool of two simulated devices, a mirror holding volumes `v` (4K blocks) and `w` (16K
//! blocks), served by an NBD server on a free port: the rig of the protocol tests.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use zeta::dsl::Pool;
use zeta::nbd::{PoolExports, Server, ServerConfig};
use zeta::vdev::mem::MemDevice;

use super::nbd_client::Client;
use super::{mem_devs, opts, spec, Layout, MB};

pub const VOL: &str = "tank/v";
pub const VOLSIZE: u64 = 8 * MB;

pub struct Rig {
    pub devs: Vec<Arc<MemDevice>>,
    pub pool: Arc<Pool>,
    pub server: Option<Server>,
}

impl Rig {
    pub fn new(cfg: ServerConfig) -> Rig {
        let devs = mem_devs(2, 128 * MB);
        let pool = Pool::create("tank", spec(Layout::Mirror, &devs), opts()).unwrap();
        pool.create_volume("v", VOLSIZE, 4096, None).unwrap();
        pool.create_volume("w", VOLSIZE, 16384, None).unwrap();
        let exports = Arc::new(PoolExports::new(vec![pool.clone()], None));
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            ..cfg
        };
        let server = Server::start(cfg, exports).unwrap();
        Rig {
            devs,
            pool,
            server: Some(server),
        }
    }

    pub fn default() -> Rig {
        Rig::new(ServerConfig::default())
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.as_ref().unwrap().local_addr()
    }

    /// A fresh session still works: the server survived whatever the test did.
    pub fn assert_serving(&self) {
        let mut c = Client::open(self.addr(), VOL);
        assert_eq!(c.write(0, &[9u8; 4096]), 0);
        assert_eq!(c.read(0, 4096).unwrap(), vec![9u8; 4096]);
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        let _ = self.pool.close();
    }
}
