//! `serve`'s HTTP child of the node's tree: binds the API's listeners (plain HTTP, HTTPS when
//! `[ssl]` turns it on, the metrics on their own port with `[prometheus]`), keeps the ports
//! first bound across restarts of the child, and serves the API with `/_steps` on each.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::http::connection_limit::ConnectionLimit;
use crate::http::{self, AppState, HttpConfig};
use crate::replicator::{Replicator, ServiceError, ServiceFn};

use super::serve_steps::StepsSetup;
use super::ssl_section::{self, Https};

/// Where the API listens: plain HTTP always, HTTPS too when `[ssl]` turns it on.
#[derive(Debug, Clone)]
pub(super) struct Listeners {
    pub(super) http: SocketAddr,
    pub(super) https: Option<Https>,
    /// The metrics on their own (`[prometheus]`).
    pub(super) prometheus: Option<SocketAddr>,
    /// Connections one client address may hold on them all together.
    pub(super) per_client: usize,
}

/// The addresses the API's listeners are bound to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bound {
    pub(super) http: SocketAddr,
    pub(super) https: Option<SocketAddr>,
}

/// Where the child reports the bound addresses, or why binding failed.
pub(super) type BoundTx = Arc<tokio::sync::watch::Sender<Option<Result<Bound, String>>>>;

/// The HTTP child: binds its listeners (the ports first bound are kept across restarts, so
/// a restarted API comes back where clients expect it) and serves the API with `/_steps`
/// on each. Reports the bound addresses, or why binding failed, on `bound`; ends when
/// either server fails.
pub(super) fn http_service(
    at: Listeners,
    config: HttpConfig,
    steps: StepsSetup,
    bound: BoundTx,
) -> ServiceFn {
    Arc::new(move |rep: Arc<Replicator>| {
        let config = config.clone();
        let steps = steps.clone();
        let bound = bound.clone();
        let at = at.clone();
        Box::pin(async move {
            let limit = Arc::new(ConnectionLimit::new(at.per_client));
            let (listener, https) = match bind_all(&at, &bound, &limit).await {
                Ok(l) => l,
                Err(msg) => {
                    bound.send_replace(Some(Err(msg.clone())));
                    return Err(ServiceError::host(msg));
                }
            };
            let local = listener.local_addr()?;
            let steps = steps
                .steps(rep.jobs().clone())
                .map_err(ServiceError::host)?;
            let metrics = match at.prometheus {
                None => None,
                Some(a) => Some(http::bind_listener(a).await.map_err(|e| {
                    ServiceError::host(format!("cannot listen on {a} ([prometheus]): {e}"))
                })?),
            };
            let state = AppState::new(rep, config);
            let state_for_metrics = state.clone();
            let limit_for_metrics = limit.clone();
            let metrics = async move {
                match metrics {
                    Some(l) => {
                        let router = http::metrics_router(state_for_metrics);
                        let never = std::future::pending();
                        http::serve_router_within(l, router, limit_for_metrics, never).await
                    }
                    None => std::future::pending().await,
                }
            };
            let router = http::router_with_steps(state, Some(steps));
            bound.send_replace(Some(Ok(Bound {
                http: local,
                https: https.as_ref().map(|l| l.local_addr()),
            })));
            let plain =
                http::serve_router_within(listener, router.clone(), limit, std::future::pending());
            let tls = async move {
                match https {
                    Some(tls) => {
                        let secure = axum::middleware::from_fn(http::cookie::secure_over_tls);
                        tls.serve(router.layer(secure)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = plain => r.map_err(ServiceError::from),
                r = metrics => r.map_err(ServiceError::from),
                r = tls => r.map_err(|e| ServiceError::host(format!("HTTPS server: {e}"))),
            }
        })
    })
}

/// Binds the listeners, at the addresses bound before if the API is restarting.
async fn bind_all(
    at: &Listeners,
    bound: &BoundTx,
    limit: &Arc<ConnectionLimit>,
) -> Result<(tokio::net::TcpListener, Option<ssl_section::HttpsListener>), String> {
    let before = match bound.borrow().as_ref() {
        Some(Ok(b)) => Some(*b),
        _ => None,
    };
    let http_at = before.map_or(at.http, |b| b.http);
    let listener = http::bind_listener(http_at)
        .await
        .map_err(|e| format!("cannot listen on {http_at}: {e}"))?;
    let https = match &at.https {
        None => None,
        Some(h) => Some(
            h.bind(
                before.and_then(|b| b.https).unwrap_or(h.addr),
                limit.clone(),
            )
            .await?,
        ),
    };
    Ok((listener, https))
}
