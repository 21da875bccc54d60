"""Tenants and billing days: a client's tenant and billing day, overrides aimed at a
tenant, and the tenant tier allowed in plan limits and overrides.

Revision ID: 0002_tenants
Revises: 0001_quota_tables
Create Date: 2026-12-01 13:00:00

Existing rows keep their meaning: every client starts without a tenant and on
QUOTA_BILLING_DAY, every override stays its client's. Batch mode, so that SQLite
(which cannot alter a constraint in place) rebuilds the tables with their rows.
"""
from alembic import op
import sqlalchemy as sa


revision = '0002_tenants'
down_revision = '0001_quota_tables'
branch_labels = None
depends_on = None

OLD_TIERS = "tier IN ('global', 'user', 'endpoint')"
NEW_TIERS = "tier IN ('global', 'tenant', 'user', 'endpoint')"
TARGET = (
    "(client_id IS NOT NULL AND tenant IS NULL) OR (client_id IS NULL AND tenant IS NOT NULL)"
)


def upgrade() -> None:
    with op.batch_alter_table('quota_clients', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('billing_day', sa.Integer(), nullable=True))
        batch_op.create_index(batch_op.f('ix_quota_clients_tenant'), ['tenant'], unique=False)
        batch_op.create_check_constraint(
            batch_op.f('ck_quota_clients_billing_day'), 'billing_day BETWEEN 1 AND 31'
        )

    with op.batch_alter_table('quota_plan_limits', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_quota_plan_limits_tier'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_quota_plan_limits_tier'), NEW_TIERS)

    with op.batch_alter_table('quota_overrides', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=64), nullable=True))
        batch_op.alter_column('client_id', existing_type=sa.Integer(), nullable=True)
        batch_op.drop_constraint(batch_op.f('ck_quota_overrides_tier'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_quota_overrides_tier'), NEW_TIERS)
        batch_op.create_check_constraint(batch_op.f('ck_quota_overrides_target'), TARGET)
        batch_op.create_unique_constraint(
            batch_op.f('uq_quota_overrides_tenant_tier_resource'), ['tenant', 'tier', 'resource']
        )


def downgrade() -> None:
    # Tenant rows cannot exist in 0001's tables: they go, as does the tenant tier.
    op.execute("DELETE FROM quota_overrides WHERE client_id IS NULL OR tier = 'tenant'")
    op.execute("DELETE FROM quota_plan_limits WHERE tier = 'tenant'")
    with op.batch_alter_table('quota_overrides', schema=None) as batch_op:
        batch_op.drop_constraint(
            batch_op.f('uq_quota_overrides_tenant_tier_resource'), type_='unique'
        )
        batch_op.drop_constraint(batch_op.f('ck_quota_overrides_target'), type_='check')
        batch_op.drop_constraint(batch_op.f('ck_quota_overrides_tier'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_quota_overrides_tier'), OLD_TIERS)
        batch_op.alter_column('client_id', existing_type=sa.Integer(), nullable=False)
        batch_op.drop_column('tenant')

    with op.batch_alter_table('quota_plan_limits', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_quota_plan_limits_tier'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_quota_plan_limits_tier'), OLD_TIERS)

    with op.batch_alter_table('quota_clients', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_quota_clients_billing_day'), type_='check')
        batch_op.drop_index(batch_op.f('ix_quota_clients_tenant'))
        batch_op.drop_column('billing_day')
        batch_op.drop_column('tenant')
