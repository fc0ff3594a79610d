//! TLS on both listeners: one certificate and key for the gRPC and HTTP ports, and
//! optionally a CA whose client certificates alone are accepted (mutual TLS: Envoy presents
//! its certificate). rustls with the `ring` provider, as rein's Redis connections use.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// Where the listeners' certificate, key and (optionally) client CA are.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The certificate chain, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Clients must present a certificate signed by this CA (PEM); `None`: any client.
    pub client_ca: Option<PathBuf>,
}

/// The files' PEM texts.
#[derive(Clone, Debug)]
pub struct Pem {
    /// The certificate chain.
    pub cert: Vec<u8>,
    /// Its key.
    pub key: Vec<u8>,
    /// The client CA, if any.
    pub client_ca: Option<Vec<u8>>,
}

/// Why TLS could not be set up: the file and what is wrong with it.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A file cannot be read, or holds no usable PEM item.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// rustls refuses the certificate and key together (a key that is not the
    /// certificate's, an unsupported algorithm).
    #[error("the certificate and key do not make a TLS server: {0}")]
    Config(#[from] rustls::Error),
}

impl TlsFiles {
    /// The PEM texts, for tonic's `ServerTlsConfig`.
    pub fn pem(&self) -> Result<Pem, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| TlsError::File {
                path: path.to_owned(),
                message: e.to_string(),
            })
        };
        // Parse too, so that a bad file fails here with its name, not inside a listener.
        self.rustls()?;
        Ok(Pem {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_deref().map(read).transpose()?,
        })
    }

    /// A rustls server configuration for the HTTP listener (HTTP/1.1; gRPC's listener
    /// gets its own from tonic, from [`pem`](Self::pem)).
    pub fn rustls(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let bad = |path: &Path, message: String| TlsError::File {
            path: path.to_owned(),
            message,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| bad(&self.cert, e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&self.cert, e.to_string()))?;
        if certs.is_empty() {
            return Err(bad(&self.cert, "no certificate in the file".into()));
        }
        let key = PrivateKeyDer::from_pem_file(&self.key)
            .map_err(|e| bad(&self.key, format!("no private key: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in
                    CertificateDer::pem_file_iter(path).map_err(|e| bad(path, e.to_string()))?
                {
                    roots
                        .add(cert.map_err(|e| bad(path, e.to_string()))?)
                        .map_err(|e| bad(path, e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(bad(path, "no CA certificate in the file".into()));
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| bad(path, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(certs, key)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
